// The projector page: the pool, the queues, the block tables, the figures and what just
// happened, redrawn from every frame the server pushes.
"use strict";

const MAX_ROWS = 6;  // block-table rows shown; the rest are counted
const MAX_QUEUE = 14;
const EVENTS_KEPT = 5;
const $ = (id) => document.getElementById(id);
const eventLog = [];

function figure(value, name) {
  const shown = value === null || value === undefined ? "–" : value;
  return `<div class="figure"><span class="value">${shown}</span><span class="name">${name}</span></div>`;
}

function showFigures(frame) {
  const f = frame.figures;
  const prefill = f.prefix_hit_tokens + f.prefill_tokens_computed;
  const hitShare = prefill ? Math.round((100 * f.prefix_hit_tokens) / prefill) + "%" : "–";
  $("figures").innerHTML =
    figure(f.tokens_per_s, "tokens / s") +
    figure(f.ttft_ms_mean === null ? null : Math.round(f.ttft_ms_mean) + " ms", "mean time to first token") +
    figure(`${f.num_free_blocks} / ${frame.num_blocks}`, "blocks free") +
    figure(hitShare, `prompt tokens from the prefix cache (${f.prefix_hit_tokens})`) +
    figure(f.num_requests_running, "requests running") +
    figure(f.num_requests_waiting, "requests waiting") +
    figure(f.cow_copies, "copy-on-write copies") +
    figure(f.evictions, "cached blocks evicted") +
    figure(f.preemptions, "preemptions") +
    figure(f.requests_finished, "requests done");
}

function chip(frame, block, color) {
  const el = document.createElement("span");
  el.className = "chip";
  el.textContent = block;
  const ref = frame.blocks.length ? frame.blocks[block][0] : 1;
  if (ref > 1) el.classList.add("shared");
  el.style.background = color;
  el.style.color = Live.textColor(color);
  return el;
}

function showQueues(frame) {
  const states = Live.config.palette.states;
  const running = $("running");
  running.replaceChildren();
  for (const r of frame.running.slice(0, MAX_QUEUE)) {
    const li = document.createElement("li");
    const [color] = frame.inks[r.id] || ["#9e9e9e"];
    li.style.background = color;
    li.style.color = Live.textColor(color);
    const state = r.samples[0].state;
    li.style.borderColor = states[state] || "transparent";
    li.textContent = `${r.label} ${r.samples.reduce((n, s) => n + s.tokens, 0)} tok` +
      (r.samples.length > 1 ? ` (n=${r.samples.length})` : "") + (state === "prefill" ? " prefill" : "");
    running.appendChild(li);
  }
  const waiting = $("waiting");
  waiting.replaceChildren();
  for (const r of frame.waiting.slice(0, MAX_QUEUE)) {
    const li = document.createElement("li");
    li.style.background = states.waiting;
    li.textContent = r.label;
    waiting.appendChild(li);
  }
  for (const [list, all] of [[running, frame.running], [waiting, frame.waiting]]) {
    if (all.length > MAX_QUEUE) {
      const li = document.createElement("li");
      li.className = "more";
      li.textContent = `+${all.length - MAX_QUEUE} more`;
      list.appendChild(li);
    }
  }
}

function showTables(frame) {
  const table = $("tables");
  table.replaceChildren();
  const rows = frame.running.flatMap((r) => r.samples.map((s) => [r, s]));
  for (const [r, s] of rows.slice(0, MAX_ROWS)) {
    const tr = table.insertRow();
    const name = tr.insertCell();
    name.textContent = r.samples.length > 1 ? `${r.label}.${s.sample}` : r.label;
    const cells = tr.insertCell();
    const [color] = frame.inks[r.id] || ["#9e9e9e"];
    for (const b of s.blocks) cells.appendChild(chip(frame, b, color));
  }
  if (rows.length > MAX_ROWS) {
    const tr = table.insertRow();
    tr.insertCell().textContent = `+${rows.length - MAX_ROWS} more`;
  }
}

function logEvents(frame) {
  const e = frame.events;
  const names = Live.labels(frame);
  const add = (cls, text) => eventLog.unshift({ cls, text });
  for (const [src, dst] of e.cow) add("cow", `copy-on-write: block ${src} → ${dst}`);
  if (e.hits.length) add("hit", `prefix cache: ${e.hits.length} block(s) reused (${e.hits.slice(0, 6).join(", ")}${e.hits.length > 6 ? ", …" : ""})`);
  if (e.evicted.length) add("evicted", `evicted: block(s) ${e.evicted.slice(0, 8).join(", ")} lost their cached prefix`);
  for (const r of e.preempted) add("preempted", `preempted: ${names[r] || "R" + r} (blocks freed; recomputed later)`);
  eventLog.splice(EVENTS_KEPT);
  const ul = $("event-log");
  ul.replaceChildren();
  for (const item of eventLog) {
    const li = document.createElement("li");
    li.className = item.cls;
    li.textContent = item.text;
    ul.appendChild(li);
  }
}

// The lesson's prompt: the first blocks of every student's request, the same blocks for all of
// them (prefix caching); how many requests hold them now is their ref_cnt.
function showLesson(frame) {
  const config = Live.config;
  const k = Math.floor(config.preamble_tokens / frame.block_size);
  if (!k) return;
  const what = config.chat ? "system prompt" : "preamble";
  let text = `The lesson's ${what}: ${config.preamble_tokens} tokens, ${k} full blocks`;
  const first = frame.running.length && frame.blocks.length ? frame.running[0].samples[0].blocks.slice(0, k) : [];
  if (first.length === k) {
    const held = Math.min(...first.map((b) => frame.blocks[b][0]));
    text += ` (${first.slice(0, 8).join(", ")}${k > 8 ? ", …" : ""}), held by ${held} sequence(s) now`;
  }
  $("lesson").textContent = text;
}

function onFrame(frame) {
  Live.drawPool($("pool"), frame, null);
  $("pool-caption").textContent =
    `${frame.num_blocks} × ${frame.block_size} tokens · step ${frame.step}`;
  showLesson(frame);
  showFigures(frame);
  showQueues(frame);
  showTables(frame);
  logEvents(frame);
  document.body.dataset.frame = frame.frame;
}

function onStatus(ok, text) {
  $("status").textContent = text;
  $("status").classList.toggle("down", !ok);
  if (ok && Live.config) {
    $("model").textContent = `${Live.config.model} · ${Live.config.layout} KV cache`;
    Live.legend($("legend"));
  }
}

Live.connect(onFrame, onStatus);
