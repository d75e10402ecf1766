// The status panel: /pages/status once (model, capabilities, plugins), /stats every 2 s.
"use strict";

const STATS_EVERY_MS = 2000;

function facts(dl, rows) {
  dl.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v === null || v === undefined ? "—" : String(v) })]));
}

function testClass(result) {
  if (result === "pass") return "pass";
  if (String(result).startsWith("fail")) return "fail";
  return "na";
}

function showStatus(s) {
  const m = s.model;
  document.getElementById("chat-model").textContent = m.id;
  facts(document.getElementById("model-facts"), [
    ["model", m.id], ["model type", m.model_type], ["family plugin", m.family + " (" + m.tier + ")"],
    ["context window", m.context_window], ["context ceiling", m.context_ceiling], ["source", m.source],
  ]);
  const caps = document.getElementById("capabilities");
  caps.replaceChildren(...Object.entries(m.capabilities).map(([k, on]) => el("span", { class: "badge " + (on ? "on" : "off"), text: k })));
  document.getElementById("attach-label").hidden = !m.capabilities.vision;
  const tests = document.querySelector("#self-test tbody");
  tests.replaceChildren(...Object.entries(m.self_test).map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { class: testClass(v), text: v }))));
  const plugins = document.querySelector("#plugins tbody");
  plugins.replaceChildren(...s.plugins.map((p) => el("tr", { class: "plugin-" + p.status, title: p.error || p.hooks.join(", ") },
    el("td", { text: p.name }), el("td", { text: p.kind }),
    el("td", { class: p.status === "failed" ? "fail" : (p.status === "loaded" ? "pass" : "na"), text: p.status + (p.error ? ": " + p.error : "") }))));
}

function showStats(st) {
  const e = st.engine;
  const cache = e.prompt_cache;
  const adm = e.admission || {};
  facts(document.getElementById("engine-facts"), [
    ["lane", e.lane + " (batch " + e.batch_size + ")"],
    ["running rows", e.running_rows], ["queue", e.queue_depth + " / " + e.max_queue],
    ["tokens/s", e.tokens_per_second], ["tokens generated", e.tokens_generated],
    ["requests served", e.requests_served], ["cancelled", e.requests_cancelled], ["rejected", e.requests_rejected],
    ["prompt-cache hit rate", (100 * cache.hit_rate).toFixed(1) + " % of " + cache.lookups + " lookups"],
    ["prompt cache", cache.entries + " entries, " + fmtBytes(cache.bytes)],
    ["memory budget", adm.budget_bytes ? fmtBytes(adm.budget_bytes) : "none"],
    ["weights", fmtBytes(adm.weight_bytes)], ["safe context", adm.safe_context],
    ["MLX active", fmtBytes(e.mlx_active_bytes)], ["BLAS", st.blas ? st.blas.text : "—"],
  ]);
  const failed = Object.keys(st.plugins.failed || {});
  document.getElementById("status-updated").textContent = "· updated " + new Date().toLocaleTimeString() + (failed.length ? " · failed plugins: " + failed.join(", ") : "");
}

async function refreshStats() {
  try {
    showStats(await api("/stats"));
    document.getElementById("status-error").textContent = "";
  } catch (err) {
    document.getElementById("status-error").textContent = "stats: " + err.message;
  }
}

document.addEventListener("DOMContentLoaded", async () => {
  try {
    showStatus(await api("/pages/status"));
  } catch (err) {
    document.getElementById("status-error").textContent = "status: " + err.message;
  }
  refreshStats();
  setInterval(refreshStats, STATS_EVERY_MS);
});
