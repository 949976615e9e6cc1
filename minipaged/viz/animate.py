"""Animations for slides: a real engine run, one frame per step, played by matplotlib's ``FuncAnimation``.

A scripted run of the embedded model is recorded once (:func:`prefix_frames`, :func:`engine_frames`:
every ``StepSnapshot``, with what each step did, :mod:`minipaged.viz.frames`); frame ``k`` is then a
pure function of snapshot ``k``: :func:`draw_frame`, the stage 5 step picture
(:func:`~minipaged.viz.scheduler.draw_step`) with the step's caption, its events written on the
blocks (``hit``, ``new``, ``copy of 3``, ``evicted``, ``freed``) and running totals.
:func:`animation` hands that function to ``FuncAnimation``; :func:`render` saves it as a GIF
(``PillowWriter``) or as a page that plays offline (``to_jshtml``)::

    python -m minipaged animate prefix --out prefix.gif     # shared preamble, fork, copy-on-write, LRU eviction
    python -m minipaged animate engine --out engine.html    # arrivals, chunked prefill, growth, preemption

In a notebook: ``movie = animate.prefix_frames()``, then ``animate.player(movie)`` (a Play button and
a step slider, frames drawn as they are first shown) or ``animate.inline_html(movie)`` (the player
as a cell output that plays without a kernel). Frames are 1280 x 800 pixels at 100 dpi.
"""

from __future__ import annotations

import html
import io
import re
from pathlib import Path

from matplotlib.animation import FuncAnimation, PillowWriter
from matplotlib.figure import Figure

from minipaged.viz.frames import SCENARIOS, Movie, run_scenario
from minipaged.viz.scheduler import draw_step

WIDTH, HEIGHT, DPI = 1280, 800, 100  # pixels of a frame at DPI
FPS = 1.5  # engine steps per second: time to read a caption
# to_jshtml's buttons are Font Awesome icons from a CDN: offline pages draw them as characters instead.
ICONS = {"minus": "−", "plus": "+", "play": "▶", "pause": "❚❚", "step-backward": "◀❙", "step-forward": "❙▶"}
ICONS |= {"fast-backward": "⏮", "fast-forward": "⏭"}
OFFLINE_CSS = "".join(f'.fa-{k}::before {{ content: "{v}"; }}\n' for k, v in ICONS.items())
OFFLINE_CSS += (
    ".fa-flip-horizontal { display: inline-block; transform: scaleX(-1); }\nbody { font-family: sans-serif; }"
)


def prefix_frames(max_steps: int = 200) -> Movie:
    """The ``prefix`` run: sharing a preamble, a fork with copy-on-write, eviction, a hit after eviction."""
    return run_scenario("prefix", max_steps)


def engine_frames(max_steps: int = 200) -> Movie:
    """The ``engine`` run: arrivals, chunked prefill, block tables growing, preemption and resumption."""
    return run_scenario("engine", max_steps)


def new_frame(dpi: int = DPI) -> Figure:
    """An empty figure of a frame's size (``WIDTH`` x ``HEIGHT`` pixels at 100 dpi; ``dpi`` scales it)."""
    return Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=dpi, layout="constrained")


def draw_frame(movie: Movie, k: int, fig: Figure | None = None) -> Figure:
    """Frame ``k`` of ``movie``, drawn from its snapshot alone (into ``fig`` when given, after clearing it)."""
    frame, t = movie.frames[k], movie.frames[k].totals
    notes = [f"token budget per step: {movie.token_budget or 'none'}", "", "totals so far:"]
    notes += [f"prefix-cache hits: {t['prefix_hit_tokens']} tokens", f"copies on write: {t['cow_copies']}"]
    notes += [f"evictions: {t['evictions']}", f"preemptions: {t['preemptions']}"]
    usage = [(f.snapshot.step, movie.num_blocks - f.snapshot.num_free_blocks) for f in movie.frames]
    title = f"{movie.title}   (frame {k + 1} of {len(movie.frames)})"
    fig, tags = fig or new_frame(), frame.events.tags()
    kw = dict(fig=fig, inks=movie.inks, caption=frame.caption, tags=tags, notes=notes, usage=usage)
    return draw_step(frame.snapshot, movie.block_size, movie.names, title, **kw)


def animation(movie: Movie, fps: float = FPS, dpi: int = DPI) -> FuncAnimation:
    """``movie`` as a ``FuncAnimation``: frame ``k`` is :func:`draw_frame` of snapshot ``k``, ``fps`` steps a second."""
    if not movie.frames:
        raise ValueError("the movie has no frames: run more engine steps")
    fig = new_frame(dpi)
    return FuncAnimation(fig, lambda k: draw_frame(movie, k, fig).axes, frames=len(movie.frames), interval=1000 / fps)


def frame_png(movie: Movie, k: int, fig: Figure | None = None) -> bytes:
    """Frame ``k`` as PNG bytes, exactly ``WIDTH`` x ``HEIGHT`` (no tight bounding box: every frame the same size)."""
    buf = io.BytesIO()
    draw_frame(movie, k, fig).savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def jshtml(movie: Movie, fps: float = FPS, dpi: int = DPI) -> str:
    """``to_jshtml()``'s player (every frame a PNG inside the page), with its icons drawn without the internet."""
    player = re.sub(r"<link[^>]*font-awesome[^>]*>", "", animation(movie, fps, dpi).to_jshtml(fps=fps))
    return f"<style>\n{OFFLINE_CSS}\n</style>\n{player}"


def render(movie: Movie, path: str | Path, fps: float = FPS, dpi: int = DPI) -> Path:
    """Write ``movie`` as an animated GIF (``.gif``, ``PillowWriter``) or a self-contained page (``.html``)."""
    path = _checked(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gif":
        animation(movie, fps, dpi).save(path, writer=PillowWriter(fps=fps), dpi=dpi)
        return path
    captions = "".join(f"<li>{html.escape(f.caption)}</li>\n" for f in movie.frames)
    path.write_text(
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(movie.title)}</title>'
        f"</head>\n<body>\n{jshtml(movie, fps, dpi)}\n<details><summary>captions</summary><ol>\n{captions}</ol>"
        "</details>\n</body></html>\n",
        encoding="utf-8",
    )
    return path


def _checked(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix not in (".gif", ".html"):
        raise ValueError(f"unknown animation format {path.suffix!r}: name the file .gif or .html")
    return path


def player(movie: Movie):
    """A notebook player: Play button and step slider over the frames (each drawn once, when first shown)."""
    import ipywidgets as w

    fig, cache = new_frame(), {}

    def png(k: int) -> bytes:
        return cache[k] if k in cache else cache.setdefault(k, frame_png(movie, k, fig))

    last = len(movie.frames) - 1
    play = w.Play(min=0, max=last, interval=int(1000 / FPS), description="play")
    slider = w.IntSlider(min=0, max=last, description="frame", layout=w.Layout(width="420px"))
    w.jslink((play, "value"), (slider, "value"))
    image = w.Image(value=png(0), format="png", layout=w.Layout(width="100%", max_width=f"{WIDTH}px"))
    slider.observe(lambda change: setattr(image, "value", png(change["new"])), names="value")
    return w.VBox([w.HBox([play, slider]), image])


def inline_html(movie: Movie, fps: float = FPS):
    """:func:`jshtml`'s player as a notebook output that plays without a kernel (all frames drawn now and
    stored in the notebook: trim long movies with :meth:`~minipaged.viz.frames.Movie.head` first)."""
    from IPython.display import HTML

    return HTML(jshtml(movie, fps))


def main(which: str, out: str | Path, fps: float = FPS, max_frames: int | None = None, dpi: int = DPI) -> Path:
    """``python -m minipaged animate {prefix,engine} --out FILE``: run the scenario and write the animation."""
    if which not in SCENARIOS:
        raise ValueError(f"unknown animation {which!r}: choose one of {', '.join(SCENARIOS)}")
    if max_frames is not None and max_frames < 1:
        raise ValueError(f"max_frames must be at least 1, got {max_frames}")
    if fps <= 0 or dpi < 20:
        raise ValueError(f"fps must be positive and dpi at least 20, got fps={fps}, dpi={dpi}")
    _checked(out)  # before the run, not after it
    movie = run_scenario(which, max_steps=max_frames or 200)  # one frame per step
    path = render(movie, out, fps=fps, dpi=dpi)
    size = f"{WIDTH * dpi // DPI}x{HEIGHT * dpi // DPI} px"
    print(f"wrote {path} ({len(movie.frames)} frames, {size}, {fps} frames per second)")
    return path
