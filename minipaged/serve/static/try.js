// /try: a student sends a request through the OpenAI API (streaming) and sees their own blocks
// on the pool. With a chat model it is a chat: the page keeps the conversation and sends all of
// it each turn to /v1/chat/completions (the server puts the lesson's system prompt first); with
// a model that cannot chat (the embedded copy model) it sends the text to /v1/completions.
// Every request carries the student's name as OpenAI's `user` field: the projector shows it as
// the request's owner, and this page outlines the blocks of that owner.
"use strict";

const $ = (id) => document.getElementById(id);
let mine = null;  // the owner name of this student's requests
let messages = [];  // the chat so far: {role, content}

// A short request can hold blocks for a single frame, and the next frame may follow within
// milliseconds: a picture that shows this student's blocks stays up at least HOLD_MS, then the
// newest frame is drawn.
const HOLD_MS = 1500;
let latest = null;  // the newest frame received
let holdUntil = 0;  // until when the picture of this student's blocks stays up
let holdTimer = null;

function showsMine(frame) {
  const labels = Live.labels(frame);
  return Boolean(mine) && frame.blocks.some(([, , owners]) => owners.some((o) => labels[o] === mine));
}

function onFrame(frame) {
  latest = frame;
  document.body.dataset.frame = frame.frame;
  const mineNow = showsMine(frame);
  if (!mineNow && performance.now() < holdUntil) return;  // drawn when the hold ends
  Live.drawPool($("mine-pool"), frame, mine);
  if (mineNow) {
    holdUntil = performance.now() + HOLD_MS;
    clearTimeout(holdTimer);
    holdTimer = setTimeout(() => Live.drawPool($("mine-pool"), latest, mine), HOLD_MS);
  }
}

function describeLesson(config) {
  const blocks = Math.floor(config.preamble_tokens / config.block_size);
  const shared = `${config.preamble_tokens} tokens: its first ${blocks} blocks of ${config.block_size} ` +
    "are the same for everyone, stored once and marked ×N on the pool";
  if (config.chat) {
    $("system").hidden = false;
    $("system-text").textContent = config.preamble;
    return `Every chat starts with the lesson's system prompt (${shared}).`;
  }
  return `Your text is sent after the lesson's shared preamble (${config.preamble.length} characters, ${shared}).`;
}

function onStatus(ok, text) {
  $("status").textContent = text;
  if (ok && Live.config) {
    const config = Live.config;
    Live.legend($("legend"));
    $("preamble-note").textContent = config.preamble ? describeLesson(config) : "";
    if (config.chat) {
      $("title").textContent = `Chat with ${config.model}`;
      $("text-label").textContent = "Your message";
      $("answer-title").hidden = $("answer").hidden = true;
      $("transcript").hidden = $("new-chat").hidden = false;
    }
  }
}

// Read a server-sent-event stream of completion chunks; call onText for each piece of text.
async function readStream(response, onText) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const line = buffer.slice(0, end).replace(/^data: /, "");
      buffer = buffer.slice(end + 2);
      if (line === "[DONE]") return;
      const chunk = JSON.parse(line);
      if (chunk.error) throw new Error(chunk.error.message);
      for (const c of chunk.choices) onText(c.delta ? c.delta.content || "" : c.text);
    }
  }
}

// POST a streamed request; call onText for each piece of the answer.
async function post(path, body, onText) {
  const response = await fetch(path, {
    method: "POST",
    headers: Live.headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(Object.assign({ max_tokens: Number($("max-tokens").value), stream: true, user: mine }, body)),
  });
  if (!response.ok) {
    const answer = await response.json().catch(() => ({}));
    throw new Error((answer.error && answer.error.message) || "HTTP " + response.status);
  }
  await readStream(response, onText);
}

function bubble(role, text) {
  const li = document.createElement("li");
  li.className = role;
  li.textContent = text;
  $("transcript").appendChild(li);
  return li;
}

async function chatTurn(text) {
  messages.push({ role: "user", content: text });
  bubble("user", text);
  const reply = bubble("assistant", "");
  try {
    await post("/v1/chat/completions", { messages, temperature: 0 }, (piece) => { reply.textContent += piece; });
    messages.push({ role: "assistant", content: reply.textContent });
    $("text").value = "";
  } catch (e) {
    messages.pop();  // the turn did not happen: it is not sent again
    reply.textContent = e.message;
    reply.classList.add("error");
  }
}

async function completion(text) {
  const answer = $("answer");
  answer.textContent = "";
  answer.classList.remove("error");
  try {
    await post("/v1/completions", { prompt: text, temperature: 0 }, (piece) => { answer.textContent += piece; });
  } catch (e) {
    answer.textContent = e.message;
    answer.classList.add("error");
  }
}

async function send(event) {
  event.preventDefault();
  const name = $("name").value.trim().slice(0, 12);
  // a unique owner name, so that two students called Ana are told apart; kept for a whole chat
  if (!mine || !mine.startsWith(name + "·")) mine = name + "·" + Math.floor(Math.random() * 90 + 10);
  $("send").disabled = true;
  try {
    await (Live.config && Live.config.chat ? chatTurn : completion)($("text").value);
  } finally {
    $("send").disabled = false;
  }
}

$("form").addEventListener("submit", send);
$("new-chat").addEventListener("click", () => {
  messages = [];
  $("transcript").replaceChildren();
});
Live.connect(onFrame, onStatus);
