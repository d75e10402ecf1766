// Helpers shared by the mlxrt pages: API calls (with the optional API key), SSE reading, DOM.
"use strict";

const KEY_STORE = "mlxrt.apiKey";

function apiHeaders(extra) {
  const headers = Object.assign({ "Content-Type": "application/json" }, extra || {});
  const key = localStorage.getItem(KEY_STORE);
  if (key) headers["Authorization"] = "Bearer " + key;
  return headers;
}

// A JSON call; resolves to the body, rejects with an Error whose message is the server's.
async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = apiHeaders(opts.headers);
  if (opts.body !== undefined && typeof opts.body !== "string") opts.body = JSON.stringify(opts.body);
  const resp = await fetch(path, opts);
  const text = await resp.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
  if (!resp.ok) {
    const message = body && body.error ? (body.error.message || JSON.stringify(body.error)) : (text || resp.statusText);
    const err = new Error(message);
    err.status = resp.status;
    throw err;
  }
  return body;
}

// POST a streaming request and call onData(parsedJson) for each SSE data frame until [DONE].
async function streamSSE(path, body, onData, signal) {
  const resp = await fetch(path, { method: "POST", headers: apiHeaders(), body: JSON.stringify(body), signal });
  if (!resp.ok) {
    const text = await resp.text();
    let message = text;
    try { message = JSON.parse(text).error.message; } catch (e) { /* not JSON */ }
    const err = new Error(message || resp.statusText);
    err.status = resp.status;
    throw err;
  }
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of frame.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

// el("div", {class: "x", text: "hi"}, child, ...)
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

// The API-key box in the header (stored in this browser only).
function setupKeyBox() {
  const input = document.getElementById("api-key");
  if (!input) return;
  input.value = localStorage.getItem(KEY_STORE) || "";
  input.addEventListener("change", () => {
    if (input.value) localStorage.setItem(KEY_STORE, input.value);
    else localStorage.removeItem(KEY_STORE);
  });
}

document.addEventListener("DOMContentLoaded", setupKeyBox);
