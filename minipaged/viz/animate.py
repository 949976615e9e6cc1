"""Animations for slides: a real engine run, one frame per step, played by matplotlib's ``FuncAnimation``.

A scripted run of the embedded model (:data:`SCENARIOS`) is recorded once: every ``StepSnapshot``,
with what each step did, read off two consecutive snapshots
(:func:`~minipaged.viz.step_events.step_events`), a caption saying so and running totals
(:func:`build_frames` -> :class:`Movie`). Frame ``k`` is then a pure function of snapshot ``k``
(:func:`draw_frame`: the stage 5 step picture with the caption and the events written on the
blocks). :func:`render` saves the ``FuncAnimation`` as a GIF (``PillowWriter``) or as a page that
plays offline (``to_jshtml``); in a notebook, :func:`player` is a Play button and a slider::

    python -m minipaged animate prefix --out prefix.gif     # shared preamble, fork, copy-on-write, LRU eviction
    python -m minipaged animate engine --out engine.html    # arrivals, chunked prefill, growth, preemption
"""

from __future__ import annotations

import dataclasses
import html
import io
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.animation import FuncAnimation, PillowWriter
from matplotlib.figure import Figure

from minipaged.viz.palette import SEQUENCE_COLORS, Ink, inks_over_time, owner_inks
from minipaged.viz.scheduler import draw_step, seq_names
from minipaged.viz.step_events import StepEvents, live, step_events
from minipaged.viz.style import figure_text, png_with_text

if TYPE_CHECKING:
    import ipywidgets

    from minipaged.viz.snapshot import StepSnapshot


@dataclass
class Frame:
    """One animation frame: a step's snapshot, what changed, the caption that says so, running totals
    (``prefix_hit_tokens``, ``cow_copies``, ``evictions``, ``preemptions``)."""

    snapshot: StepSnapshot
    events: StepEvents
    caption: str
    totals: dict[str, int]


@dataclass
class Movie:
    """Frames plus what every frame shares: sequence names and colours, pool geometry."""

    title: str
    frames: list[Frame]
    names: dict[int, str]
    inks: dict[Hashable, Ink]  # seq_id -> colour (and hatch), never shared by two sequences alive at once
    block_size: int
    num_blocks: int
    token_budget: int | None = None  # the engine's max_num_batched_tokens, when known

    def head(self, max_frames: int | None) -> Movie:
        """The first ``max_frames`` frames (all when None), for short previews and fast tests."""
        return dataclasses.replace(self, frames=self.frames if max_frames is None else self.frames[:max_frames])


def block_tags(ev: StepEvents) -> dict[int, str]:
    """Block -> the word an animation writes on it."""
    out = {b: "hit" for bs in ev.hits.values() for b in bs} | {b: "new" for bs in ev.grown.values() for b in bs}
    out |= {new: f"copy\nof {old}" for _, old, new in ev.cow}
    return out | dict.fromkeys(ev.evicted, "evicted") | dict.fromkeys(ev.freed, "freed")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _blocks(ids: Sequence[int]) -> str:
    return ("block " if len(ids) == 1 else "blocks ") + ", ".join(map(str, ids))


def _admitted(name: str, seq: int, snap: StepSnapshot, ev: StepEvents, block_size: int) -> str:
    """The clause of a sequence admitted (or resumed) in the step: its prefix hit, what it computes."""
    hit, work = ev.hits.get(seq, []), next(d for d in snap.scheduled if d["seq_id"] == seq)
    how = "is admitted" if seq not in ev.arrived else "arrives and is admitted"
    how = "resumes after preemption" if seq in ev.resumed else how
    revived = " from the free queue" if set(hit) <= set(ev.revived) else ""
    what = f"{name} {how}" + (
        f": {len(hit)} cached blocks hit{revived} ({len(hit) * block_size} tokens)," if hit else ":"
    )
    return f"{what} {'recomputes' if seq in ev.resumed else 'prefills'} {work['num_tokens']} tokens"


def caption(
    prev: StepSnapshot | None, snap: StepSnapshot, ev: StepEvents, names: Mapping[int, str], block_size: int
) -> str:
    """One clause per event, in the order the step did them; a plain summary when nothing special happened."""
    before = prev.block_tables if prev else {}

    def nm(seq: int) -> str:
        return names.get(seq, f"seq {seq}")

    def freed_by(seqs: Sequence[int]) -> list[int]:
        return [b for b in ev.freed if any(b in before.get(s, []) for s in seqs)]

    parts = [
        f"the pool is full: {nm(s)}, the newest running sequence, is preempted and gives back "
        f"{_plural(len(freed_by([s])), 'block')}; it will be recomputed later"
        for s in ev.preempted
    ]
    for seq, old, new in ev.cow:
        keep = [nm(s) for s, t in snap.block_tables.items() if old in t]
        parts.append(
            f"copy-on-write: {nm(seq)} writes into block {old}, which it shares, so it gets its own copy, "
            f"block {new}" + (f"; {', '.join(keep)} keeps block {old}" if keep else "")
        )
    parts += [_admitted(nm(seq), seq, snap, ev, block_size) for seq in ev.admitted]
    waiting = [nm(s) for s in ev.arrived if s not in ev.admitted]
    if waiting:
        parts.append(f"{', '.join(waiting)} {'arrives' if len(waiting) == 1 else 'arrive'} and waits")
    takers = {b: s for s, bs in ev.grown.items() for b in bs} | {new: s for s, _, new in ev.cow}
    for seq in dict.fromkeys(takers[b] for b in ev.evicted if b in takers):
        mine = [b for b in ev.evicted if takers.get(b) == seq]
        parts.append(
            f"{nm(seq)} needs {_plural(len(mine), 'block')}: {_blocks(mine)}, least recently freed, "
            "evicted from the prefix cache"
        )
    parts += [f"{nm(p)} forks {nm(c)}: both share its {len(snap.block_tables[c])} blocks" for p, c in ev.forked]
    parts += [
        f"{nm(d['seq_id'])} prefills {d['num_tokens']} more tokens (chunked prefill: "
        f"{snap.num_tokens.get(d['seq_id'], 0)} in cache)"
        for d in snap.scheduled
        if d["kind"] == "prefill" and d["seq_id"] not in ev.admitted
    ]
    if ev.finished:
        freed = freed_by(ev.finished)
        kept = sum(snap.cached[b] for b in freed)
        parts.append(
            f"{', '.join(nm(s) for s in ev.finished)} finished: {_plural(len(freed), 'block')} freed"
            + (f" ({kept} stay cached)" if kept else "")
        )
    decodes = sum(d["kind"] == "decode" for d in snap.scheduled)
    if not parts:
        one = f"{_plural(decodes, 'sequence')} decode{'s' * (decodes == 1)} one token" + " each" * (decodes > 1)
        parts.append(one if decodes else "nothing to run")
    for seq, blocks in ev.grown.items():
        if seq not in ev.admitted and not any(b in takers and b in ev.evicted for b in blocks):
            parts.append(f"{nm(seq)}'s table grows by {_blocks(blocks)}")
    return f"step {snap.step}: " + "; ".join(parts)


def build_frames(
    snapshots: Sequence[StepSnapshot],
    block_size: int,
    num_blocks: int,
    title: str = "",
    names: Mapping[int, str] | None = None,
    token_budget: int | None = None,
) -> Movie:
    """A :class:`Movie` with one frame per snapshot (paged cache only: snapshots need ``ref_cnt``).

    For a run of your own: ``build_frames(snaps, llm.block_size, llm.num_blocks, "my run")``, where
    ``snaps`` are what :func:`~minipaged.viz.snapshot.step_snapshot` returned, every one from the
    first step on (a run watched from the middle works too; its first frame simply finds its
    sequences already there).
    """
    names = dict(names or seq_names(snapshots, lambda r: chr(ord("A") + r) if r < 26 else f"R{r}"))  # A, B, ...
    for snap in snapshots:  # sequences never scheduled in these snapshots keep their id
        for s in [*live(snap), *snap.block_tables]:
            names.setdefault(s, f"seq {s}")
    totals = dict(prefix_hit_tokens=0, cow_copies=0, evictions=0, preemptions=0)
    frames: list[Frame] = []
    prev: StepSnapshot | None = None
    preempted: set[int] = set()
    for snap in snapshots:
        ev = step_events(prev, snap, block_size)
        ev.resumed = [s for s in ev.admitted if s in preempted]
        preempted.update(ev.preempted)
        now = (sum(map(len, ev.hits.values())) * block_size, len(ev.cow), len(ev.evicted), len(ev.preempted))
        totals = {k: v + n for (k, v), n in zip(totals.items(), now)}
        frames.append(Frame(snap, ev, caption(prev, snap, ev, names, block_size), totals))
        prev = snap
    alive = [[names[s] for s in live(snap)] for snap in snapshots]
    everyone = {n for a in alive for n in a}
    # A colour of its own for each sequence (A blue, B orange, ...) while there are enough; past
    # that, colours are reused, never by two sequences alive at once.
    by_name = owner_inks(everyone) if len(everyone) <= len(SEQUENCE_COLORS) else inks_over_time(alive)
    inks: dict[Hashable, Ink] = {s: by_name[n] for s, n in names.items() if n in by_name}
    return Movie(title, frames, names, inks, block_size, num_blocks, token_budget)


SYSTEM = "You are a careful copy machine. "  # 32 characters: 4 full blocks of 8 tokens
# name -> (title, LLM keyword arguments, requests added before a step: (step, text, preamble, samples)).
SCENARIOS: dict[str, tuple[str, dict[str, Any], list[tuple[int, str, str, int]]]] = {
    # Four requests share a preamble; C samples twice (a fork, then copy-on-write); D, with another
    # preamble, takes the last never-used blocks, so later growth evicts cached blocks (least
    # recently freed first); E, after everyone else sharing it is gone, still finds the preamble cached.
    "prefix": (
        "Prefix caching: shared blocks, copy-on-write, LRU eviction",
        dict(
            block_size=8, num_kvcache_blocks=16, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=True
        ),
        [(0, "kv cache", SYSTEM, 1), (2, "paged blocks", SYSTEM, 1), (4, "fork me", SYSTEM, 2)]
        + [(9, "eviction", "Say it back: ", 1), (16, "lru", SYSTEM, 1)],
    ),
    # Five requests on a small pool with a 16-token budget: prompts are prefilled in chunks, tables
    # grow as tokens are decoded, the newest sequence is preempted when the pool runs dry.
    "engine": (
        "Continuous batching: chunked prefill, growing tables, preemption",
        dict(block_size=8, num_kvcache_blocks=12, max_num_seqs=4, max_num_batched_tokens=16),
        [(0, "continuous batching", "", 1), (0, "pages", "", 1), (2, "chunked prefill splits", "long prompt: ", 1)]
        + [(5, "preempt me", "", 1), (8, "done", "", 1)],
    ),
}


def run_scenario(which: str, max_steps: int = 200, max_tokens: int = 32) -> Movie:
    """Run the embedded model through ``SCENARIOS[which]``, one step (``step_snapshot``) per frame.

    Requests are added before the step their arrival names (idle stretches are skipped); every
    snapshot is kept, then turned into a :class:`Movie` by :func:`build_frames`.
    """
    from minipaged.engine.llm import LLM
    from minipaged.engine.sampling_params import SamplingParams
    from minipaged.tiny.task import prompt_for
    from minipaged.viz.snapshot import step_snapshot

    title, engine, arrivals = SCENARIOS[which]
    llm, pending = LLM(**engine), sorted(arrivals, key=lambda a: a[0])
    snapshots: list[StepSnapshot] = []
    skipped = 0
    while (pending or llm.has_unfinished_requests()) and len(snapshots) < max_steps:
        if not llm.has_unfinished_requests():  # idle until the next arrival: skip the empty steps
            skipped = pending[0][0] - len(snapshots)
        while pending and pending[0][0] - skipped <= len(snapshots):
            _, text, preamble, n = pending.pop(0)
            llm.add_request(prompt_for(text, preamble), SamplingParams(temperature=0, max_tokens=max_tokens, n=n))
        snapshots.append(step_snapshot(llm))
    return build_frames(snapshots, llm.block_size, llm.num_blocks, title, None, engine["max_num_batched_tokens"])


WIDTH, HEIGHT, DPI = 1280, 800, 100  # pixels of a frame at DPI
FPS = 1.5  # engine steps per second: time to read a caption
# to_jshtml's buttons are Font Awesome icons from a CDN: offline pages draw them as characters instead.
ICONS = {"minus": "−", "plus": "+", "play": "▶", "pause": "❚❚", "step-backward": "|◀", "step-forward": "▶|"}
ICONS |= {"fast-backward": "|◀◀", "fast-forward": "▶▶|"}
OFFLINE_CSS = "".join(f'.fa-{k}::before {{ content: "{v}"; }}\n' for k, v in ICONS.items())
OFFLINE_CSS += ".fa-flip-horizontal { display: inline-block; transform: scaleX(-1); }\n"


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
    fig, tags = fig or new_frame(), block_tags(frame.events)
    return draw_step(
        frame.snapshot,
        movie.block_size,
        movie.names,
        title,
        fig=fig,
        inks=movie.inks,
        caption=frame.caption,
        tags=tags,
        notes=notes,
        usage=usage,
    )


def animation(movie: Movie, fps: float = FPS, dpi: int = DPI) -> FuncAnimation:
    """``movie`` as a ``FuncAnimation``: frame ``k`` is :func:`draw_frame` of snapshot ``k``, ``fps`` steps a second."""
    if not movie.frames:
        raise ValueError("the movie has no frames: run more engine steps")
    fig = new_frame(dpi)
    return FuncAnimation(fig, lambda k: draw_frame(movie, k, fig).axes, frames=len(movie.frames), interval=1000 / fps)


def frame_png(movie: Movie, k: int, fig: Figure | None = None) -> bytes:
    """Frame ``k`` as PNG bytes, exactly ``WIDTH`` x ``HEIGHT`` (no tight bounding box: every frame the same size)."""
    buf = io.BytesIO()
    drawn = draw_frame(movie, k, fig)
    drawn.savefig(buf, format="png", dpi=DPI)
    return png_with_text(buf.getvalue(), figure_text(drawn))


def jshtml(movie: Movie, fps: float = FPS, dpi: int = DPI) -> str:
    """``to_jshtml()``'s player, every frame a PNG inside it, its icons drawn without the internet: a page's
    body, or a notebook output that plays without a kernel (``IPython.display.HTML(jshtml(movie))``)."""
    player = re.sub(r"<link[^>]*font-awesome[^>]*>", "", animation(movie, fps, dpi).to_jshtml(fps=fps))  # type: ignore[arg-type]  # stubs say int; matplotlib takes any fps (1000 / fps ms)
    return f"<style>\n{OFFLINE_CSS}\n</style>\n{player}"


def render(movie: Movie, path: str | Path, fps: float = FPS, dpi: int = DPI) -> Path:
    """Write ``movie`` as an animated GIF (``.gif``, ``PillowWriter``) or a self-contained page (``.html``)."""
    path = _checked(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gif":
        writer = PillowWriter(fps=fps)  # type: ignore[arg-type]  # stubs say int; a float fps works (1000 / fps ms)
        animation(movie, fps, dpi).save(path, writer=writer, dpi=dpi)
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


def player(movie: Movie) -> ipywidgets.VBox:
    """A notebook player: Play button and step slider over the frames (each drawn once, when first shown)."""
    import ipywidgets as w

    fig, cache = new_frame(), dict[int, bytes]()

    def png(k: int) -> bytes:
        return cache[k] if k in cache else cache.setdefault(k, frame_png(movie, k, fig))

    last = len(movie.frames) - 1
    play = w.Play(min=0, max=last, interval=int(1000 / FPS), description="play")
    slider = w.IntSlider(min=0, max=last, description="frame", layout=w.Layout(width="420px"))
    w.jslink((play, "value"), (slider, "value"))
    image = w.Image(value=png(0), format="png", layout=w.Layout(width="100%", max_width=f"{WIDTH}px"))
    slider.observe(lambda change: setattr(image, "value", png(change["new"])), names="value")
    return w.VBox([w.HBox([play, slider]), image])


def main(which: str, out: str | Path, fps: float = FPS, max_frames: int | None = None, dpi: int = DPI) -> Path:
    """``python -m minipaged animate {prefix,engine} --out FILE`` (which checks ``fps``, ``max_frames``
    and ``dpi``): run the scenario and write the animation."""
    if which not in SCENARIOS:
        raise ValueError(f"unknown animation {which!r}: choose one of {', '.join(SCENARIOS)}")
    _checked(out)  # before the run, not after it
    movie = run_scenario(which, max_steps=max_frames or 200)  # one frame per step
    path = render(movie, out, fps=fps, dpi=dpi)
    size = f"{WIDTH * dpi // DPI}x{HEIGHT * dpi // DPI} px"
    print(f"wrote {path} ({len(movie.frames)} frames, {size}, {fps} frames per second)")
    return path
