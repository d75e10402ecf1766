// The curve designer: edit the curve's control points, see the transfer curve, the next-token
// distribution (model vs curve vs recipe) and N samples per side from POST /v1/curves/sample.
"use strict";

const PRESETS = {
  identity: [[1, 1], [100, 100]],
  sharpen: [[0.01, 0.0001], [1, 0.5], [20, 25], [100, 100]],
  flatten: [[0.1, 0.3], [10, 12], [60, 30], [100, 40]],
  cool: [[0.01, 0.000193], [1, 0.139], [100, 100]],
};
const PLOT = { w: 520, h: 300, left: 48, right: 12, top: 10, bottom: 34, minExp: -4, maxExp: 2 };
const SVGNS = "http://www.w3.org/2000/svg";
const state = { seq: 0, controller: null, timer: null, lastPlot: [] };

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// -- the control points table ------------------------------------------------------------------

function pointRow(x, y) {
  const tr = el("tr", { class: "point" },
    el("td", {}, el("input", { type: "number", class: "x", min: "0", max: "100", step: "any", value: String(x) })),
    el("td", {}, el("input", { type: "number", class: "y", min: "0", max: "100", step: "any", value: String(y) })),
    el("td", {}, el("button", { type: "button", class: "remove", title: "remove this point", text: "×",
      onclick: () => { tr.remove(); schedule(); } })));
  return tr;
}

function setPoints(points) {
  document.querySelector("#points tbody").replaceChildren(...points.map(([x, y]) => pointRow(x, y)));
}

function readPoints() {
  return [...document.querySelectorAll("#points tr.point")].map((tr) => ({
    x_pct: Number(tr.querySelector(".x").value), y_pct: Number(tr.querySelector(".y").value),
  }));
}

function num(id) { return Number(document.getElementById(id).value); }

function requestBody() {
  return {
    prompt: document.getElementById("prompt").value,
    chat: document.getElementById("chat").checked,
    curve: { space: "logprob", monotonic: true, points: readPoints() },
    recipe: { temperature: num("temperature"), top_p: num("top_p"), top_k: Math.trunc(num("top_k")), min_p: num("min_p") },
    n: Math.trunc(num("n")), max_tokens: Math.trunc(num("max_tokens")), seed: Math.trunc(num("seed")), top: Math.trunc(num("top")),
  };
}

// -- the transfer-curve plot (log10 percent on both axes) -------------------------------------

function sx(pct) {
  const e = Math.log10(Math.max(pct, 10 ** (PLOT.minExp - 1)));
  return PLOT.left + (e - PLOT.minExp) / (PLOT.maxExp - PLOT.minExp) * (PLOT.w - PLOT.left - PLOT.right);
}
function sy(pct) {
  const e = Math.min(Math.max(Math.log10(Math.max(pct, 1e-30)), PLOT.minExp - 1), PLOT.maxExp + 1);
  return PLOT.h - PLOT.bottom - (e - PLOT.minExp) / (PLOT.maxExp - PLOT.minExp) * (PLOT.h - PLOT.top - PLOT.bottom);
}
function invX(px) {
  const e = PLOT.minExp + (px - PLOT.left) / (PLOT.w - PLOT.left - PLOT.right) * (PLOT.maxExp - PLOT.minExp);
  return Math.min(100, 10 ** e);
}
function invY(py) {
  const e = PLOT.minExp + (PLOT.h - PLOT.bottom - py) / (PLOT.h - PLOT.top - PLOT.bottom) * (PLOT.maxExp - PLOT.minExp);
  return Math.min(100, 10 ** e);
}

function round3(v) { return Number(v.toPrecision(3)); }

function drawCurve(plot, bad) {
  const root = document.getElementById("curve-plot");
  // The line is clipped to the plotting area (a curve leaves it below the lowest decade).
  const clip = svg("clipPath", { id: "plot-area" });
  clip.append(svg("rect", { x: PLOT.left, y: PLOT.top, width: PLOT.w - PLOT.left - PLOT.right, height: PLOT.h - PLOT.top - PLOT.bottom }));
  const nodes = [clip];
  for (let e = PLOT.minExp; e <= PLOT.maxExp; e++) {
    const p = 10 ** e;
    nodes.push(svg("line", { class: "grid", x1: sx(p), x2: sx(p), y1: PLOT.top, y2: PLOT.h - PLOT.bottom }));
    nodes.push(svg("line", { class: "grid", x1: PLOT.left, x2: PLOT.w - PLOT.right, y1: sy(p), y2: sy(p) }));
    const label = e >= 0 ? String(p) : p.toExponential(0);
    nodes.push(svg("text", { x: sx(p), y: PLOT.h - PLOT.bottom + 14, "text-anchor": "middle" }, label + "%"));
    nodes.push(svg("text", { x: PLOT.left - 4, y: sy(p) + 4, "text-anchor": "end" }, label));
  }
  nodes.push(svg("text", { x: (PLOT.w + PLOT.left) / 2, y: PLOT.h - 4, "text-anchor": "middle" }, "input probability (x_pct)"));
  nodes.push(svg("line", { class: "identity", x1: sx(10 ** PLOT.minExp), y1: sy(10 ** PLOT.minExp), x2: sx(100), y2: sy(100) }));
  if (plot.length) {
    const d = plot.map((p, i) => (i ? "L" : "M") + sx(p.x_pct).toFixed(1) + "," + sy(p.y_pct).toFixed(1)).join(" ");
    nodes.push(svg("path", { class: "curve-line", id: "curve-line", d, "clip-path": "url(#plot-area)" }));
  }
  readPoints().forEach((p, i) => {
    const knot = svg("circle", { class: "knot" + (bad ? " bad" : ""), r: 6, cx: sx(p.x_pct), cy: sy(p.y_pct), "data-index": i });
    knot.addEventListener("pointerdown", startDrag);
    nodes.push(knot);
  });
  root.replaceChildren(...nodes);
}

function startDrag(event) {
  const knot = event.target;
  const index = Number(knot.getAttribute("data-index"));
  const root = document.getElementById("curve-plot");
  knot.setPointerCapture(event.pointerId);
  const move = (e) => {
    const box = root.getBoundingClientRect();
    const px = (e.clientX - box.left) * PLOT.w / box.width;
    const py = (e.clientY - box.top) * PLOT.h / box.height;
    const row = document.querySelectorAll("#points tr.point")[index];
    row.querySelector(".x").value = round3(invX(px));
    row.querySelector(".y").value = round3(invY(py));
    knot.setAttribute("cx", sx(invX(px)));
    knot.setAttribute("cy", sy(invY(py)));
  };
  const up = () => {
    knot.removeEventListener("pointermove", move);
    knot.removeEventListener("pointerup", up);
    schedule();
  };
  knot.addEventListener("pointermove", move);
  knot.addEventListener("pointerup", up);
}

// -- the distribution chart and the samples ---------------------------------------------------

function visible(text) {
  return JSON.stringify(text).slice(1, -1).replace(/ /g, "·");
}

function drawDistribution(rows) {
  const root = document.getElementById("dist-plot");
  const W = 520, H = 240, left = 34, bottom = 56, top = 8;
  const shown = rows.slice(0, Math.max(1, num("top")));
  const max = Math.max(1e-9, ...shown.flatMap((r) => [r.model, r.curve, r.recipe]));
  const slot = (W - left - 6) / Math.max(shown.length, 1);
  const bar = Math.max(2, slot / 4);
  const nodes = [svg("line", { class: "axis", x1: left, x2: W - 6, y1: H - bottom, y2: H - bottom })];
  for (const f of [0, 0.5, 1]) {
    const y = H - bottom - f * (H - bottom - top);
    nodes.push(svg("text", { x: left - 4, y: y + 4, "text-anchor": "end" }, (100 * f * max).toFixed(0) + "%"));
  }
  shown.forEach((r, i) => {
    const x0 = left + i * slot + (slot - 3 * bar) / 2;
    [["model", r.model], ["curve", r.curve], ["recipe", r.recipe]].forEach(([side, p], j) => {
      const h = p / max * (H - bottom - top);
      const rect = svg("rect", { class: "bar-" + side, x: x0 + j * bar, y: H - bottom - h, width: bar - 1, height: Math.max(h, 0) });
      rect.append(svg("title", {}, side + " " + (100 * p).toFixed(2) + "%"));
      nodes.push(rect);
    });
    const lx = left + i * slot + slot / 2, ly = H - bottom + 10;
    nodes.push(svg("text", { class: "token", x: lx, y: ly, "text-anchor": "end", transform: `rotate(-45 ${lx} ${ly})` }, visible(r.text).slice(0, 12)));
  });
  root.replaceChildren(...nodes);
}

function showSamples(id, samples) {
  document.getElementById(id).replaceChildren(...samples.map((s) =>
    el("li", { class: "sample", title: s.tokens + " tokens, " + s.finish_reason }, s.text || "∅")));
}

// -- running the endpoint ---------------------------------------------------------------------

function schedule() {
  clearTimeout(state.timer);
  drawCurve(state.lastPlot, false);
  state.timer = setTimeout(run, 300);
}

async function run() {
  const seq = ++state.seq;
  if (state.controller) state.controller.abort();
  state.controller = new AbortController();
  const reason = document.getElementById("curve-reason");
  document.getElementById("run-status").textContent = "sampling…";
  try {
    const res = await api("/v1/curves/sample", { method: "POST", body: requestBody(), signal: state.controller.signal });
    if (seq !== state.seq) return;
    reason.textContent = "";
    reason.className = "";
    document.getElementById("results").classList.remove("stale");
    state.lastPlot = res.curve.plot;
    drawCurve(res.curve.plot, false);
    drawDistribution(res.distribution);
    const e = res.entropy_bits;
    document.getElementById("entropy").textContent = `(entropy, bits: model ${e.model.toFixed(2)} · curve ${e.curve.toFixed(2)} · recipe ${e.recipe.toFixed(2)})`;
    showSamples("curve-samples", res.curve.samples);
    showSamples("recipe-samples", res.recipe.samples);
    document.getElementById("run-status").textContent = `${res.prompt_tokens} prompt tokens · ${res.model}`;
  } catch (err) {
    if (err.name === "AbortError" || seq !== state.seq) return;
    reason.textContent = err.message;
    reason.className = "error";
    document.getElementById("results").classList.add("stale");  // what is shown is the last valid curve's
    state.lastPlot = [];
    drawCurve([], true);
    document.getElementById("run-status").textContent = err.status ? "rejected (" + err.status + ")" : "failed";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  setPoints(PRESETS.sharpen);
  document.getElementById("editor").addEventListener("input", (e) => {
    if (e.target.id !== "api-key" && e.target.id !== "preset") schedule();
  });
  document.getElementById("preset").addEventListener("change", (e) => {
    if (PRESETS[e.target.value]) { setPoints(PRESETS[e.target.value]); schedule(); }
    e.target.value = "";
  });
  document.getElementById("add-point").addEventListener("click", () => {
    const points = readPoints();
    const last = points.length ? points[points.length - 1] : { x_pct: 1, y_pct: 1 };
    document.querySelector("#points tbody").append(pointRow(round3(Math.min(100, last.x_pct / 2 + 50)), round3(Math.min(100, last.y_pct / 2 + 50))));
    schedule();
  });
  document.getElementById("resample").addEventListener("click", () => {
    document.getElementById("seed").value = num("seed") + num("n");
    run();
  });
  drawCurve([], false);
  run();
});
