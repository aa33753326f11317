// hyla's chat page: conversations kept in this browser (localStorage), replies streamed from
// /v1/chat/completions, reasoning shown folded, tool calls shown, images attached as data URLs,
// the sampling settings, and Stop. No framework and no network access beyond this server.
"use strict";

const $ = (id) => document.getElementById(id);
const store = {
  load() {
    try {
      return JSON.parse(localStorage.getItem("hyla.conversations")) || [];
    } catch {
      return [];
    }
  },
  save(conversations) {
    localStorage.setItem("hyla.conversations", JSON.stringify(conversations));
  },
};

let conversations = store.load();
let current = null;      // the conversation shown
let attachments = [];    // data URLs waiting for the next message
let controller = null;   // the reply being streamed

const settingIds = ["system", "temperature", "top_p", "max_tokens", "api_key"];

function saveSettings() {
  for (const id of settingIds) localStorage.setItem("hyla." + id, $(id).value);
}

function loadSettings() {
  for (const id of settingIds) {
    const value = localStorage.getItem("hyla." + id);
    if (value !== null) $(id).value = value;
  }
}

function newConversation() {
  current = { id: Date.now().toString(36), title: "New conversation", messages: [] };
  conversations.unshift(current);
  store.save(conversations);
  render();
}

function renderList() {
  const list = $("conversations");
  list.textContent = "";
  for (const c of conversations) {
    const item = document.createElement("li");
    item.textContent = c.title;
    if (c === current) item.className = "current";
    item.onclick = () => {
      current = c;
      render();
    };
    list.appendChild(item);
  }
}

// One message's element: its role, images, folded reasoning, text (Markdown for the assistant),
// and tool calls.
function messageElement(m) {
  const el = document.createElement("div");
  el.className = "message " + m.role;
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role;
  el.appendChild(role);
  for (const url of m.images || []) {
    const img = document.createElement("img");
    img.src = url;
    el.appendChild(img);
  }
  if (m.reasoning) {
    const details = document.createElement("details");
    details.className = "reasoning";
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    const text = document.createElement("div");
    text.textContent = m.reasoning;
    details.append(summary, text);
    el.appendChild(details);
  }
  const body = document.createElement("div");
  body.className = "body";
  if (m.role === "assistant") body.innerHTML = renderMarkdown(m.content || "");
  else body.textContent = m.content;
  el.appendChild(body);
  for (const call of m.tool_calls || []) {
    const c = document.createElement("div");
    c.className = "tool-call";
    c.textContent = call.function.name + "(" + call.function.arguments + ")";
    el.appendChild(c);
  }
  if (m.error) {
    const e = document.createElement("div");
    e.className = "error";
    e.textContent = m.error;
    el.appendChild(e);
  }
  return el;
}

function render() {
  renderList();
  const box = $("messages");
  box.textContent = "";
  for (const m of current ? current.messages : []) box.appendChild(messageElement(m));
  box.scrollTop = box.scrollHeight;
}

// The conversation as the API takes it: images as image_url parts, reasoning sent back (Kimi K3
// needs its own on every assistant turn).
function apiMessages() {
  const out = [];
  const system = $("system").value.trim();
  if (system) out.push({ role: "system", content: system });
  for (const m of current.messages) {
    if (m.role === "user") {
      const content = m.images && m.images.length
        ? [{ type: "text", text: m.content }, ...m.images.map((url) => ({ type: "image_url", image_url: { url } }))]
        : m.content;
      out.push({ role: "user", content });
    } else if (m.content || m.reasoning || (m.tool_calls && m.tool_calls.length)) {  // not a reply stopped at once
      const a = { role: "assistant", content: m.content || "" };
      if (m.reasoning) a.reasoning_content = m.reasoning;
      if (m.tool_calls && m.tool_calls.length) a.tool_calls = m.tool_calls;
      out.push(a);
    }
  }
  return out;
}

// Reads a server-sent event stream, calling onEvent with each data object.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n"))
        if (line.startsWith("data: ") && line !== "data: [DONE]") onEvent(JSON.parse(line.slice(6)));
    }
  }
}

async function send(text) {
  if (!current) newConversation();
  const user = { role: "user", content: text, images: attachments };
  attachments = [];
  $("attachments").textContent = "";
  if (current.messages.length === 0) current.title = text.slice(0, 40) || "Image";
  current.messages.push(user);
  const reply = { role: "assistant", content: "", reasoning: "", tool_calls: [] };
  current.messages.push(reply);
  render();
  const box = $("messages");
  const update = () => {  // the reply's element alone, as it grows
    box.replaceChild(messageElement(reply), box.lastChild);
    box.scrollTop = box.scrollHeight;
  };
  controller = new AbortController();
  $("stop").disabled = false;
  $("send").disabled = true;
  const headers = { "Content-Type": "application/json" };
  if ($("api_key").value) headers.Authorization = "Bearer " + $("api_key").value;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers,
      signal: controller.signal,
      body: JSON.stringify({
        messages: apiMessages(),  // the empty reply being written is left out
        stream: true,
        temperature: Number($("temperature").value),
        top_p: Number($("top_p").value),
        max_tokens: Number($("max_tokens").value),
      }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || "HTTP " + response.status);
    }
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (!chunk.choices || !chunk.choices.length) return;
      const delta = chunk.choices[0].delta || {};
      if (delta.reasoning_content) reply.reasoning += delta.reasoning_content;
      if (delta.content) reply.content += delta.content;
      for (const call of delta.tool_calls || []) {
        if (call.id) reply.tool_calls[call.index] = { id: call.id, type: "function", function: { name: call.function.name, arguments: "" } };
        reply.tool_calls[call.index].function.arguments += call.function.arguments || "";
      }
      update();
    });
  } catch (e) {
    if (e.name !== "AbortError") reply.error = e.message;
  } finally {
    controller = null;
    $("stop").disabled = true;
    $("send").disabled = false;
    store.save(conversations);
    render();
  }
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

window.addEventListener("DOMContentLoaded", async () => {
  loadSettings();
  for (const id of settingIds) $(id).addEventListener("change", saveSettings);
  $("new-chat").onclick = newConversation;
  $("stop").onclick = () => controller && controller.abort();
  $("composer").onsubmit = (event) => {
    event.preventDefault();
    const text = $("input").value;
    if (!text.trim() && !attachments.length) return;
    $("input").value = "";
    send(text);
  };
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("attach").onchange = async () => {
    for (const file of $("attach").files) {
      const url = await readImage(file);
      attachments.push(url);
      const img = document.createElement("img");
      img.src = url;
      $("attachments").appendChild(img);
    }
    $("attach").value = "";
  };
  current = conversations[0] || null;
  render();
  try {
    const headers = $("api_key").value ? { Authorization: "Bearer " + $("api_key").value } : {};
    const props = await (await fetch("/props", { headers })).json();
    $("model").textContent = props.model_alias + " · " + props.default_generation_settings.n_ctx + " tokens";
  } catch {
    $("model").textContent = "";
  }
});
