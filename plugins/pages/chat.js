// The chat panel: streams /v1/chat/completions, shows reasoning collapsed and tool calls as cards.
"use strict";

const chat = { history: [], controller: null, image: null };

function numberOrNull(id) {
  const v = document.getElementById(id).value;
  return v === "" ? null : Number(v);
}

function requestBody() {
  const messages = [];
  const system = document.getElementById("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...chat.history);
  const body = { messages, stream: true };
  for (const k of ["temperature", "top_p", "top_k", "max_tokens"]) {
    const v = numberOrNull(k);
    if (v !== null) body[k] = v;
  }
  const tools = document.getElementById("tools").value.trim();
  if (tools) {
    try { body.tools = JSON.parse(tools); } catch (e) { throw new Error("tools is not valid JSON: " + e.message); }
  }
  return body;
}

function bubble(role, text) {
  const node = el("div", { class: "msg " + role });
  if (text) node.append(el("div", { class: "content", text }));
  document.getElementById("messages").append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

// The assistant's bubble as it streams: reasoning (collapsed), content, tool-call cards.
function assistantView() {
  const node = bubble("assistant", "");
  const reasoning = el("details", { class: "reasoning", hidden: "" }, el("summary", { text: "Reasoning" }));
  const reasoningText = el("div", { class: "reasoning-text" });
  reasoning.append(reasoningText);
  const content = el("div", { class: "content" });
  const tools = el("div", { class: "tools" });
  const meta = el("div", { class: "meta" });
  node.append(reasoning, content, tools, meta);
  const calls = [];
  return {
    node, content, meta, calls,
    addReasoning(t) { reasoning.hidden = false; reasoningText.textContent += t; },
    addContent(t) { content.textContent += t; node.scrollIntoView({ block: "end" }); },
    addToolDelta(d) {
      const i = d.index || 0;
      if (!calls[i]) {
        const name = el("span", { class: "name" });
        const args = el("pre", { class: "args" });
        calls[i] = { id: d.id, name: "", arguments: "", nameNode: name, argsNode: args };
        tools.append(el("div", { class: "tool-card" }, el("div", {}, "tool call ", name), args));
      }
      const c = calls[i];
      if (d.id) c.id = d.id;
      if (d.function && d.function.name) { c.name += d.function.name; c.nameNode.textContent = c.name; }
      if (d.function && d.function.arguments) { c.arguments += d.function.arguments; c.argsNode.textContent = c.arguments; }
    },
  };
}

function setBusy(busy) {
  document.getElementById("send").disabled = busy;
  document.getElementById("stop").disabled = !busy;
  document.getElementById("chat-status").textContent = busy ? "generating…" : "";
}

async function send(event) {
  if (event) event.preventDefault();
  const input = document.getElementById("prompt");
  const text = input.value.trim();
  if (!text || chat.controller) return;
  input.value = "";
  let content = text;
  const user = bubble("user", text);
  if (chat.image) {
    content = [{ type: "text", text }, { type: "image_url", image_url: { url: chat.image } }];
    user.append(el("img", { src: chat.image, alt: "attached image" }));
    chat.image = null;
    document.getElementById("attach").value = "";
  }
  chat.history.push({ role: "user", content });
  const view = assistantView();
  chat.controller = new AbortController();
  setBusy(true);
  let finish = null;
  let usage = null;
  try {
    await streamSSE("/v1/chat/completions", requestBody(), (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));  // failed mid-stream
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const d = choice.delta || {};
        if (d.reasoning_content || d.reasoning) view.addReasoning(d.reasoning_content || d.reasoning);
        if (d.content) view.addContent(d.content);
        for (const t of d.tool_calls || []) view.addToolDelta(t);
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }, chat.controller.signal);
  } catch (err) {
    if (err.name === "AbortError") finish = "stopped";
    else {
      view.node.classList.add("error");
      view.meta.textContent = "error: " + err.message;
      chat.history.pop();  // the turn failed: a retry must not send it twice
    }
  } finally {
    chat.controller = null;
    setBusy(false);
  }
  const reply = { role: "assistant", content: view.content.textContent };
  const calls = view.calls.filter(Boolean);
  if (calls.length) {
    reply.tool_calls = calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
  }
  if (finish !== null || view.content.textContent) chat.history.push(reply);
  if (finish) view.meta.textContent = "finish: " + finish + (usage ? " · " + usage.completion_tokens + " tokens" : "");
}

function stop() {
  if (chat.controller) chat.controller.abort();
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("composer").addEventListener("submit", send);
  document.getElementById("stop").addEventListener("click", stop);
  document.getElementById("clear").addEventListener("click", () => {
    stop();
    chat.history = [];
    document.getElementById("messages").replaceChildren();
  });
  document.getElementById("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) send(e);
  });
  document.getElementById("attach").addEventListener("change", (e) => {
    const file = e.target.files[0];
    if (!file) { chat.image = null; return; }
    const reader = new FileReader();
    reader.onload = () => { chat.image = reader.result; };
    reader.readAsDataURL(file);
  });
});
