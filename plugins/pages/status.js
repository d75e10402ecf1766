// The status panel: /pages/status once (model, capabilities, plugins), /stats every 2 s, and
// /v1/memory/status every 2 s when the mlxrt-memory plugin is loaded and memory is on (a run's
// live progress). A 404 there means memory is off (no --memory-dir): the page asks no more.
"use strict";

const STATS_EVERY_MS = 2000;
const MEMORY_EVENTS_SHOWN = 8;
let memoryLoaded = false;

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
  memoryLoaded = s.plugins.some((p) => p.name === "memory" && p.status === "loaded");
  document.getElementById("memory").hidden = !memoryLoaded;
}

async function refreshMemory() {
  const state = document.getElementById("memory-state");
  let m;
  try {
    m = await api("/v1/memory/status");
  } catch (err) {
    if (err.status === 404) {
      memoryLoaded = false; // off until the server restarts: polling would only log 404s
      state.textContent = "· off (start the server with --memory-dir)";
    } else {
      state.textContent = "· " + err.message;
    }
    return;
  }
  state.textContent = m.running ? "· synthesis running" : "· idle";
  facts(document.getElementById("memory-facts"), [
    ["folder", m.folder], ["turns", m.counts.turns + " (" + m.counts.turns_pending + " new)"],
    ["facts", m.counts.facts], ["articles", m.counts.articles], ["links", m.counts.links], ["runs", m.counts.runs],
  ]);
  document.getElementById("memory-progress").replaceChildren(...m.progress.slice(-MEMORY_EVENTS_SHOWN).map((e) =>
    el("li", { text: e.type + (e.stage ? " " + e.stage : "") + (e.message ? ": " + e.message : (e.status ? ": " + e.status : "")) })));
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
    ["models", st.models ? st.models.models.map((m) => m.id + " (" + m.state
      + (m.loading_for_seconds !== undefined ? " " + m.loading_for_seconds + " s" : "") + ")").join(", ") : "—"],
  ]);
  const failed = Object.keys(st.plugins.failed || {});
  document.getElementById("status-updated").textContent = "· updated " + new Date().toLocaleTimeString() + (failed.length ? " · failed plugins: " + failed.join(", ") : "");
}

async function refreshStats() {
  try {
    showStats(await api("/stats"));
    document.getElementById("status-error").textContent = "";
    if (memoryLoaded) await refreshMemory();
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
