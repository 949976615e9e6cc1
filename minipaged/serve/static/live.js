// What both pages share: the join code, the frame stream, and the pool drawn as SVG blocks.
// Frames come from /projector/stream (server-sent events, about 5 a second while the engine
// runs); each holds every block as [ref_cnt, cached 0/1, [owner request ids]].
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const FLASH_MS = 1500;

const Live = {
  code: new URLSearchParams(location.search).get("code"),
  config: null,

  headers(extra) {
    const h = Object.assign({}, extra || {});
    if (Live.code) h["Authorization"] = "Bearer " + Live.code;
    return h;
  },

  withCode(url) {
    return Live.code ? url + (url.includes("?") ? "&" : "?") + "code=" + encodeURIComponent(Live.code) : url;
  },

  // Load the config (palette, pool size), then call onFrame(frame) for every frame pushed.
  async connect(onFrame, onStatus) {
    const r = await fetch("/projector/config", { headers: Live.headers() });
    if (!r.ok) {
      const body = await r.json().catch(() => ({}));
      onStatus(false, (body.error && body.error.message) || "HTTP " + r.status);
      return;
    }
    Live.config = await r.json();
    const p = Live.config.palette;
    const root = document.documentElement.style;
    root.setProperty("--free", p.free);
    root.setProperty("--shared", p.shared);
    root.setProperty("--cached", p.cached);
    root.setProperty("--muted", p.muted);
    const source = new EventSource(Live.withCode("/projector/stream"));
    source.onopen = () => onStatus(true, "live");
    source.onerror = () => onStatus(false, "reconnecting…");
    source.onmessage = (e) => onFrame(JSON.parse(e.data));
  },

  textColor(hex) {
    const n = parseInt(hex.slice(1), 16);
    const lum = (0.299 * (n >> 16) + 0.587 * ((n >> 8) & 255) + 0.114 * (n & 255)) / 255;
    return lum < 0.5 ? "#ffffff" : "#000000";
  },

  // request id -> label, for every request alive in the frame
  labels(frame) {
    const out = {};
    for (const r of frame.running) out[r.id] = r.label;
    for (const r of frame.waiting) out[r.id] = r.label;
    return out;
  },

  // A pattern fill: a background colour with dots or lines (matplotlib's hatch names).
  pattern(svg, background, hatch, ink) {
    const id = "p" + (background + hatch + ink).replace(/[^a-zA-Z0-9]/g, "_");
    if (svg.querySelector("#" + id)) return "url(#" + id + ")";
    let defs = svg.querySelector("defs");
    if (!defs) defs = svg.insertBefore(document.createElementNS(SVG_NS, "defs"), svg.firstChild);
    const pat = document.createElementNS(SVG_NS, "pattern");
    pat.setAttribute("id", id);
    pat.setAttribute("patternUnits", "userSpaceOnUse");
    pat.setAttribute("width", 8);
    pat.setAttribute("height", 8);
    const shapes = {
      "..": '<circle cx="2" cy="2" r="1.2"/><circle cx="6" cy="6" r="1.2"/>',
      "//": '<path d="M0 8 L8 0" stroke-width="1.5"/>',
      "\\\\": '<path d="M0 0 L8 8" stroke-width="1.5"/>',
      "xx": '<path d="M0 0 L8 8 M0 8 L8 0" stroke-width="1.2"/>',
      "++": '<path d="M4 0 L4 8 M0 4 L8 4" stroke-width="1.2"/>',
    };
    pat.innerHTML =
      `<rect width="8" height="8" fill="${background}"/>` +
      `<g fill="${ink}" stroke="${ink}">${shapes[hatch] || ""}</g>`;
    defs.appendChild(pat);
    return "url(#" + id + ")";
  },

  // Draw frame.blocks into svg: a grid of blocks, each coloured by its state and owner.
  // mine: a label whose blocks are outlined (the /try page); the others are dimmed.
  drawPool(svg, frame, mine) {
    const p = Live.config.palette;
    const n = frame.blocks.length;
    if (n === 0) {
      svg.innerHTML = `<text x="10" y="40" font-size="28">a contiguous cache has no blocks to draw: ` +
        `${frame.figures.tokens_held} tokens in ${frame.figures.slots_allocated} reserved slots</text>`;
      return;
    }
    const box = svg.getBoundingClientRect();
    const aspect = Math.max(box.width, 1) / Math.max(box.height, 1);
    if (!svg._cells || svg._cells.length !== n || svg._aspect !== aspect) {
      svg.innerHTML = "";
      const cols = Math.max(1, Math.ceil(Math.sqrt(n * aspect)));
      const rows = Math.ceil(n / cols);
      const size = Math.min(1000 / cols, 1000 / aspect / rows);
      svg.setAttribute("viewBox", `0 0 ${cols * size} ${rows * size}`);
      svg._cells = [];
      for (let b = 0; b < n; b++) {
        const g = document.createElementNS(SVG_NS, "g");
        const rect = document.createElementNS(SVG_NS, "rect");
        const text = document.createElementNS(SVG_NS, "text");
        const x = (b % cols) * size, y = Math.floor(b / cols) * size;
        rect.setAttribute("x", x + 1.5);
        rect.setAttribute("y", y + 1.5);
        rect.setAttribute("width", size - 3);
        rect.setAttribute("height", size - 3);
        rect.setAttribute("rx", 3);
        rect.setAttribute("stroke", "#999999");
        text.setAttribute("x", x + size / 2);
        text.setAttribute("y", y + size / 2);
        text.setAttribute("text-anchor", "middle");
        text.setAttribute("dominant-baseline", "central");
        text.setAttribute("font-size", Math.max(size * 0.32, 6));
        g.appendChild(rect);
        g.appendChild(text);
        svg.appendChild(g);
        svg._cells.push({ g, rect, text, size });
      }
      svg._aspect = aspect;
    }
    const labels = Live.labels(frame);
    for (let b = 0; b < n; b++) {
      const [ref, cached, owners] = frame.blocks[b];
      const cell = svg._cells[b];
      let fill = p.free, label = "", ink = "#000000", stroke = "#999999", state = "free";
      if (ref > 1) {  // as in the course's pictures: its first owner's colour, outlined in vermillion
        const [color, hatch] = frame.inks[owners[0]] || [p.in_use, null];
        fill = hatch ? Live.pattern(svg, color, hatch, "#ffffff") : color;
        label = "×" + ref;
        ink = Live.textColor(color);
        stroke = p.shared;
        state = "shared";
      } else if (ref === 1) {
        const [color, hatch] = frame.inks[owners[0]] || [p.in_use, null];
        fill = hatch ? Live.pattern(svg, color, hatch, "#ffffff") : color;
        label = labels[owners[0]] || "";
        ink = Live.textColor(color);
        state = "used";
      } else if (cached) {
        fill = Live.pattern(svg, p.cached, "..", "#5a8fb5");
        state = "cached";
      }
      cell.rect.setAttribute("fill", fill);
      cell.rect.setAttribute("stroke", stroke);
      cell.rect.setAttribute("stroke-width", state === "shared" ? 3 : 1);
      cell.rect.dataset.state = state;
      cell.text.setAttribute("fill", ink);
      cell.text.textContent = cell.size >= 24 ? label.slice(0, cell.size >= 60 ? 6 : 3) : "";
      const isMine = mine && owners.some((o) => labels[o] === mine);
      cell.rect.classList.toggle("mine", Boolean(isMine));
      cell.g.classList.toggle("other", Boolean(mine) && ref > 0 && !isMine);
    }
    Live.flash(svg, frame.events);
  },

  flash(svg, events) {
    const mark = (b, cls) => {
      const cell = svg._cells[b];
      if (!cell) return;
      cell.rect.classList.add(cls);
      setTimeout(() => cell.rect.classList.remove(cls), FLASH_MS);
    };
    for (const [src, dst] of events.cow) { mark(src, "flash-cow"); mark(dst, "flash-cow"); }
    for (const b of events.hits) mark(b, "flash-hit");
    for (const b of events.evicted) mark(b, "flash-evicted");
  },

  legend(element) {
    const p = Live.config.palette;
    const item = (style, text) => `<span><span class="swatch" style="${style}"></span>${text}</span>`;
    element.innerHTML =
      item(`background:${p.free}`, "free") +
      item(`background:${p.states.decode}`, "in use (one colour per request)") +
      item(`background:${p.states.decode};border:3px solid ${p.shared}`, "shared (×ref_cnt)") +
      item(`background:${p.cached};border:2px dotted #5a8fb5`, "free, cached prefix") +
      item(`border:4px solid ${p.shared}`, "copy-on-write") +
      item(`border:4px solid #009e73`, "prefix hit") +
      item(`border:4px dashed #000`, "evicted");
  },
};
