// /try: a student sends text through the OpenAI API (streaming) and sees their own blocks on
// the pool. The request carries the student's name as OpenAI's `user` field: the projector
// shows it as the request's owner, and this page outlines the blocks of that owner.
"use strict";

const $ = (id) => document.getElementById(id);
let mine = null;

function onFrame(frame) {
  Live.drawPool($("mine-pool"), frame, mine);
  document.body.dataset.frame = frame.frame;
}

function onStatus(ok, text) {
  $("status").textContent = text;
  if (ok && Live.config) {
    Live.legend($("legend"));
    $("preamble-note").textContent = Live.config.preamble
      ? `Your text is sent after the lesson's shared preamble (${Live.config.preamble.length} characters), ` +
        "so its first blocks are the same for everyone."
      : "";
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
      for (const c of chunk.choices) onText(c.text);
    }
  }
}

async function send(event) {
  event.preventDefault();
  const answer = $("answer");
  answer.textContent = "";
  answer.classList.remove("error");
  // a unique owner name, so that two students called Ana are told apart
  mine = $("name").value.trim().slice(0, 12) + "·" + Math.floor(Math.random() * 90 + 10);
  $("send").disabled = true;
  try {
    const response = await fetch("/v1/completions", {
      method: "POST",
      headers: Live.headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({
        prompt: $("text").value,
        max_tokens: Number($("max-tokens").value),
        temperature: 0,
        stream: true,
        user: mine,
      }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || "HTTP " + response.status);
    }
    await readStream(response, (text) => { answer.textContent += text; });
  } catch (e) {
    answer.textContent = e.message;
    answer.classList.add("error");
  } finally {
    $("send").disabled = false;
  }
}

$("form").addEventListener("submit", send);
Live.connect(onFrame, onStatus);
