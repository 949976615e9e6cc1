"""Animations for slides: a real engine run, one frame per step, as a GIF, an HTML page or a notebook player.

Two scripted runs of the embedded model (:func:`prefix_frames`, :func:`engine_frames`) add
requests between steps and keep every ``StepSnapshot``; :mod:`minipaged.viz.frames` (where
those runs live) reads off what each step did. Each frame shows the caption, the block tables
(logical -> physical block ids, fill = tokens in cache), the queues and running totals, and the
physical pool::

    python -m minipaged animate prefix --out prefix.gif     # shared preamble, fork, copy-on-write, LRU eviction
    python -m minipaged animate engine --out engine.html    # arrivals, chunked prefill, growth, preemption

In a notebook: ``movie = animate.prefix_frames()``, then ``animate.player(movie)`` (a Play button
and a step slider, frames drawn as they are first shown), ``animate.inline_html(movie)`` (the HTML
player as a cell output that plays without a kernel) or ``animate.render(movie, "prefix.gif")``.
Frames are 1280 x 800 pixels (12.8 x 8 inches at 100 dpi) and no text is smaller than 10 pt.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import textwrap
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle
from matplotlib.ticker import MaxNLocator
from tqdm.auto import tqdm

from minipaged.viz.frames import SCENARIOS, Movie, engine_frames, prefix_frames, run_scenario
from minipaged.viz.palette import BLUE, CACHED, CACHED_HATCH, FREE, IN_USE, MUTED, SHARED, Ink

__all__ = [
    "draw_frame",
    "engine_frames",
    "frame_png",
    "frame_pngs",
    "html_page",
    "inline_html",
    "main",
    "player",
    "prefix_frames",
    "render",
]

WIDTH, HEIGHT, DPI = 1280, 800, 100
FPS = 1.5  # engine steps per second: time to read a caption


# -- drawing one frame (pixel coordinates, y down) -----------------------------------------------------
def _ink(movie: Movie, seq: int) -> Ink:
    return movie.inks.get(seq, Ink(IN_USE))


def _chip(ax, x: float, y: float, w: float, h: float, text: str, ink: Ink, size: float = 14) -> None:
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=6", fc=ink.color, ec="none", hatch=ink.hatch)
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight="bold", color=ink.text)


def _status(snap, ev, seq: int) -> tuple[str, str]:
    """(word, colour) for a sequence's row: what it did this step."""
    if seq in ev.finished:
        return "finished", MUTED
    if seq in ev.preempted:
        return "preempted", SHARED
    work = next((d for d in snap.scheduled if d["seq_id"] == seq), None)
    if work is not None:
        return f"{work['kind']} {work['num_tokens']}", "black"
    if any(child == seq for _, child in ev.forked):
        return "forked", "black"
    return ("idle" if seq in snap.running else "waiting"), MUTED


def _tables(ax, movie: Movie, k: int, top: float, bottom: float) -> None:
    """One row per sequence alive or just gone: name, status, then its blocks (fill = tokens in cache)."""
    frame = movie.frames[k]
    snap, ev, bs = frame.snapshot, frame.events, movie.block_size
    seqs = sorted(set(snap.running) | set(snap.waiting) | set(ev.finished))
    longest = max(len(t) for f in movie.frames for t in f.snapshot.block_tables.values() or [[]]) or 1
    rows = max(len(set(f.snapshot.running) | set(f.snapshot.waiting) | set(f.events.finished)) for f in movie.frames)
    ax.text(
        20,
        top,
        "Block tables: each row is a sequence; a box is one of its blocks, labelled with the "
        "physical block id (filled part = tokens in the KV cache)",
        fontsize=12,
        va="top",
    )
    row_h = min(66, (bottom - top - 26) / max(rows, 1))
    ch = max(14, min(32, row_h - 18))  # cell height; 16 px above each cell hold its tag
    cell = min(70, (910 - 200) / longest)
    hits = {b for bl in ev.hits.values() for b in bl}
    cow = {new: old for _, old, new in ev.cow}
    for r, seq in enumerate(seqs):
        y = top + 26 + r * row_h + 16  # 16 px above the cells for tags
        ink = _ink(movie, seq)
        _chip(ax, 20, y, 64, ch, movie.names.get(seq, str(seq)), ink)
        word, wc = _status(snap, ev, seq)
        ax.text(92, y + ch / 2, word, fontsize=11, va="center", color=wc)
        table = snap.block_tables.get(seq, [])
        if not table:
            note = {"finished": "blocks freed", "preempted": "blocks freed: recomputed when readmitted"}
            ax.text(200, y + ch / 2, note.get(word, "no blocks yet"), fontsize=11, va="center", color=MUTED)
        grown = set(ev.grown.get(seq, []))
        for i, b in enumerate(table):
            x = 200 + i * cell
            filled = max(0, min(bs, snap.num_tokens.get(seq, 0) - i * bs)) / bs
            shared = snap.ref_cnt[b] > 1
            ax.add_patch(Rectangle((x, y), cell - 6, ch, fc="white", ec=ink.color, lw=1.5))
            ax.add_patch(Rectangle((x, y), (cell - 6) * filled, ch, fc=ink.color, ec="none", hatch=ink.hatch))
            if shared:
                ax.add_patch(Rectangle((x, y), cell - 6, ch, fc="none", ec=SHARED, lw=3.5))
            box = None if filled == 1 else dict(boxstyle="round,pad=0.1", fc="white", ec="none")
            ax.text(
                x + (cell - 6) / 2,
                y + ch / 2,
                str(b),
                ha="center",
                va="center",
                fontsize=12,
                weight="bold",
                color=ink.text if filled == 1 else "black",
                bbox=box,
            )
            tag = (
                f"copy of {cow[b]}"
                if b in cow
                else "hit"
                if b in hits and seq in ev.hits
                else "new"
                if b in grown
                else f"×{snap.ref_cnt[b]}"
                if shared
                else ""
            )
            ax.text(x, y - 2, tag, fontsize=10, color=SHARED if b in cow or tag == "hit" else MUTED, va="bottom")


def _side(fig, ax, movie: Movie, k: int, left: float, top: float) -> None:
    """Queues, running totals and a small plot of blocks in use over the steps."""
    frame = movie.frames[k]
    snap, t = frame.snapshot, frame.totals
    nm = movie.names
    lines = [
        ("Queues", 13, "bold"),
        ("running: " + (" ".join(nm.get(s, str(s)) for s in snap.running) or "-"), 12, "normal"),
        ("waiting: " + (" ".join(nm.get(s, str(s)) for s in snap.waiting) or "-"), 12, "normal"),
        (
            f"tokens this step: {sum(d['num_tokens'] for d in snap.scheduled)} (budget {movie.token_budget})",
            12,
            "normal",
        ),
        ("", 6, "normal"),
        ("Totals so far", 13, "bold"),
        (f"free blocks: {snap.num_free_blocks} of {movie.num_blocks}", 12, "normal"),
        (f"prefix-cache hits: {t['prefix_hit_tokens']} tokens", 12, "normal"),
        (f"copies on write: {t['cow_copies']}", 12, "normal"),
        (f"evictions: {t['evictions']}", 12, "normal"),
        (f"preemptions: {t['preemptions']}", 12, "normal"),
    ]
    y = top
    for text, size, weight in lines:
        ax.text(left, y, text, fontsize=size, weight=weight, va="top")
        y += size * 1.39 + 6
    used = [movie.num_blocks - f.snapshot.num_free_blocks for f in movie.frames]
    spark = fig.add_axes([left / WIDTH, 1 - 520 / HEIGHT, (WIDTH - left - 30) / WIDTH, (520 - y - 28) / HEIGHT])
    edges = [f.snapshot.step - 0.5 for f in movie.frames] + [movie.frames[-1].snapshot.step + 0.5]
    spark.stairs(used[: k + 1], edges[: k + 2], fill=True, color=BLUE, alpha=0.35)
    spark.stairs(used[: k + 1], edges[: k + 2], color=BLUE, lw=2)
    spark.set_xlim(edges[0], edges[-1])
    spark.set_ylim(0, movie.num_blocks)
    spark.set_title("blocks in use", fontsize=12, loc="left")
    spark.tick_params(labelsize=10)
    spark.xaxis.set_major_locator(MaxNLocator(integer=True))
    spark.set_xlabel("step", fontsize=10, labelpad=1)


def _pool(ax, movie: Movie, k: int, top: float) -> None:
    """The physical blocks: owners' colours (stripes when shared), cached-but-free dotted, events tagged."""
    frame = movie.frames[k]
    snap, ev = frame.snapshot, frame.events
    n = movie.num_blocks
    ax.text(20, top, f"Physical KV pool: {n} blocks of {movie.block_size} token slots", fontsize=12, va="top")
    rows = math.ceil(n / 12)
    cols = math.ceil(n / rows)
    w, h = (WIDTH - 40) / cols, min(100, (HEIGHT - top - 62) / rows)
    owners: dict[int, list[int]] = {}
    for seq, table in snap.block_tables.items():
        for b in table:
            owners.setdefault(b, []).append(seq)
    tags = {b: "evicted" for b in ev.evicted} | {b: "freed" for b in ev.freed}
    tags |= {new: f"copy of {old}" for _, old, new in ev.cow}
    for b in range(n):
        x, y = 20 + (b % cols) * w, top + 24 + (b // cols) * h
        who = owners.get(b, [])
        if who:
            for j, seq in enumerate(who):
                ink = _ink(movie, seq)
                ax.add_patch(
                    Rectangle(
                        (x + j * (w - 6) / len(who), y),
                        (w - 6) / len(who),
                        h - 6,
                        fc=ink.color,
                        ec="none",
                        hatch=ink.hatch,
                    )
                )
            label = " ".join(movie.names.get(s, str(s)) for s in who)
        else:
            label = "cached" if snap.cached[b] else "free"
            ax.add_patch(
                Rectangle(
                    (x, y),
                    w - 6,
                    h - 6,
                    fc=CACHED if snap.cached[b] else FREE,
                    lw=0,
                    ec="#7FA7C9",
                    hatch=CACHED_HATCH if snap.cached[b] else None,
                )
            )
        shared = snap.ref_cnt[b] > 1
        ax.add_patch(
            Rectangle((x, y), w - 6, h - 6, fc="none", ec=SHARED if shared else "#444444", lw=3.5 if shared else 1)
        )
        box = dict(boxstyle="round,pad=0.15", fc="white", ec="none")
        ax.text(x + 6, y + 4, str(b), fontsize=13, weight="bold", va="top", bbox=box)
        ax.text(
            x + (w - 6) / 2,
            y + (h - 6) * 0.62,
            label + (f"  ×{snap.ref_cnt[b]}" if shared else ""),
            ha="center",
            va="center",
            fontsize=11,
            bbox=box,
            color="black" if who else MUTED,
        )
        if b in tags:
            ax.text(
                x + w - 10,
                y + 4,
                tags[b],
                ha="right",
                va="top",
                fontsize=10,
                weight="bold",
                color="white",
                bbox=dict(boxstyle="round,pad=0.2", fc=SHARED if tags[b] != "freed" else MUTED),
            )
    ax.text(
        20,
        HEIGHT - 12,
        "red outline: shared block (ref_cnt > 1)   ·   dotted blue: cached prefix nobody uses "
        "(reusable; evicted least recently used first)   ·   grey: free",
        fontsize=11,
        color=MUTED,
    )


def draw_frame(movie: Movie, k: int, fig: Figure | None = None) -> Figure:
    """Frame ``k`` of ``movie`` as a 1280 x 800 px figure (drawn into ``fig`` when given, after clearing it)."""
    if fig is None:
        fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    fig.clear()
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(HEIGHT, 0)
    ax.set_axis_off()
    frame = movie.frames[k]
    ax.text(20, 14, movie.title, fontsize=17, weight="bold", va="top")
    ax.text(WIDTH - 20, 16, f"frame {k + 1} of {len(movie.frames)}", fontsize=11, va="top", ha="right", color=MUTED)
    ax.add_patch(
        FancyBboxPatch((14, 50), WIDTH - 28, 80, boxstyle="round,pad=0,rounding_size=8", fc="#F3F3F3", ec="none")
    )
    size, width = (14, 118) if len(textwrap.wrap(frame.caption, 118)) <= 3 else (12, 138)  # stay in the box
    ax.text(26, 58, textwrap.fill(frame.caption, width), fontsize=size, va="top", linespacing=1.3)
    _tables(ax, movie, k, top=142, bottom=530)
    _side(fig, ax, movie, k, left=935, top=170)
    _pool(ax, movie, k, top=540)
    return fig


# -- output ------------------------------------------------------------------------------------------------
def frame_png(movie: Movie, k: int, fig: Figure | None = None) -> bytes:
    """Frame ``k`` as PNG bytes, exactly 1280 x 800 (no tight bounding box: every frame the same size)."""
    buf = io.BytesIO()
    draw_frame(movie, k, fig).savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def frame_pngs(movie: Movie, progress: bool = True) -> list[bytes]:
    """Every frame as PNG bytes, with a progress bar."""
    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    return [frame_png(movie, k, fig) for k in tqdm(range(len(movie.frames)), desc="frames", disable=not progress)]


def html_page(movie: Movie, pngs: list[bytes], fps: float = FPS) -> str:
    """A self-contained page (frames as data: URIs, no external files): play/pause, step slider, keys."""
    srcs = [f"data:image/png;base64,{base64.b64encode(p).decode()}" for p in pngs]
    captions = [f.caption for f in movie.frames]
    return _PAGE.format(
        title=html.escape(movie.title),
        first=srcs[0],
        last=len(srcs) - 1,
        last_plus=len(srcs),
        caption=html.escape(captions[0]),
        frames=json.dumps(srcs),
        captions=json.dumps(captions),
        delay=int(1000 / fps),
    )


def _checked(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix not in (".gif", ".html"):
        raise ValueError(f"unknown animation format {path.suffix!r}: name the file .gif or .html")
    return path


def render(movie: Movie, path: str | Path, fps: float = FPS, progress: bool = True) -> Path:
    """Write ``movie`` as an animated GIF (``.gif``) or a self-contained HTML page (``.html``)."""
    path = _checked(path)
    if not movie.frames:
        raise ValueError("the movie has no frames: run more engine steps")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".html":
        path.write_text(html_page(movie, frame_pngs(movie, progress), fps), encoding="utf-8")
        return path
    from matplotlib.animation import PillowWriter

    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    writer = PillowWriter(fps=fps)
    with writer.saving(fig, str(path), DPI):
        for k in tqdm(range(len(movie.frames)), desc="frames", disable=not progress):
            draw_frame(movie, k, fig)
            writer.grab_frame()
    return path


def player(movie: Movie):
    """A notebook player: Play button and step slider over the frames (each drawn once, when first shown)."""
    import ipywidgets as w

    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    cache: dict[int, bytes] = {}

    def png(k: int) -> bytes:
        if k not in cache:
            cache[k] = frame_png(movie, k, fig)
        return cache[k]

    last = len(movie.frames) - 1
    play = w.Play(min=0, max=last, interval=int(1000 / FPS), description="play")
    slider = w.IntSlider(min=0, max=last, description="frame", layout=w.Layout(width="420px"))
    w.jslink((play, "value"), (slider, "value"))
    image = w.Image(value=png(0), format="png", layout=w.Layout(width="100%", max_width=f"{WIDTH}px"))
    slider.observe(lambda change: setattr(image, "value", png(change["new"])), names="value")
    return w.VBox([w.HBox([play, slider]), image])


def inline_html(movie: Movie, fps: float = FPS, height: int = 900):
    """The :func:`html_page` player in an iframe, as a notebook output that plays without a kernel.

    All frames are drawn now and stored in the notebook (about 150 kB a frame): trim long movies
    with :meth:`Movie.head` first. :func:`player` draws lazily but needs a running kernel.
    """
    from IPython.display import HTML

    page = html.escape(html_page(movie, frame_pngs(movie), fps))
    return HTML(
        f'<div><iframe srcdoc="{page}" title="{html.escape(movie.title)}" '
        f'style="width: 100%; max-width: {WIDTH + 20}px; height: {height}px; border: 0"></iframe></div>'
    )


def main(which: str, out: str | Path, fps: float = FPS, max_frames: int | None = None) -> Path:
    """``python -m minipaged animate {prefix,engine} --out FILE``: run the scenario and write the animation."""
    if which not in SCENARIOS:
        raise ValueError(f"unknown animation {which!r}: choose one of {', '.join(SCENARIOS)}")
    if max_frames is not None and max_frames < 1:
        raise ValueError(f"max_frames must be at least 1, got {max_frames}")
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    _checked(out)  # before the run, not after it
    movie = run_scenario(SCENARIOS[which], max_steps=max_frames or 200)  # one frame per step
    path = render(movie, out, fps=fps)
    print(f"wrote {path} ({len(movie.frames)} frames, {WIDTH}x{HEIGHT} px, {fps} frames per second)")
    return path


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 12px; }}
img {{ max-width: 100%; height: auto; border: 1px solid #ccc; }}
.controls {{ display: flex; gap: 10px; align-items: center; font-size: 16px; margin: 6px 0; }}
input[type=range] {{ flex: 1; max-width: 700px; }}
button {{ font-size: 16px; padding: 4px 14px; }}
</style></head>
<body>
<div class="controls">
  <button id="prev" title="previous step (left arrow)">&#9664;</button>
  <button id="play" title="play / pause (space)">play</button>
  <button id="next" title="next step (right arrow)">&#9654;</button>
  <input id="slider" type="range" min="0" max="{last}" value="0">
  <span id="pos">1 / {last_plus}</span>
</div>
<img id="frame" src="{first}" alt="{caption}" width="1280" height="800">
<p id="caption">{caption}</p>
<script>
const frames = {frames};
const captions = {captions};
let k = 0, timer = null;
const img = document.getElementById("frame"), slider = document.getElementById("slider");
function show(i) {{
  k = (i + frames.length) % frames.length;
  img.src = frames[k]; img.alt = captions[k]; slider.value = k;
  document.getElementById("caption").textContent = captions[k];
  document.getElementById("pos").textContent = (k + 1) + " / " + frames.length;
}}
function toggle() {{
  const b = document.getElementById("play");
  if (timer) {{ clearInterval(timer); timer = null; b.textContent = "play"; }}
  else {{ timer = setInterval(() => show(k + 1), {delay}); b.textContent = "pause"; }}
}}
document.getElementById("play").onclick = toggle;
document.getElementById("prev").onclick = () => show(k - 1);
document.getElementById("next").onclick = () => show(k + 1);
slider.oninput = () => show(parseInt(slider.value));
document.addEventListener("keydown", e => {{
  if (e.key === " ") {{ e.preventDefault(); toggle(); }}
  if (e.key === "ArrowLeft") show(k - 1);
  if (e.key === "ArrowRight") show(k + 1);
}});
</script>
</body></html>
"""
