"""Stage 5 pictures, from ``StepSnapshot``s (what :func:`~minipaged.viz.snapshot.step_snapshot` returns)
and ``LLM.kv_stats()`` dicts.

:func:`draw_step`: one step (every sequence's block table and what it did, the queues, the pool; an
animation frame is this picture with a caption and the step's events on the blocks);
:func:`draw_timeline`: every sequence over the steps; :func:`draw_kv_usage`: KV slots over the steps,
paged against contiguous. :func:`seq_names` names sequences (``R3``: request 3; ``R3.1``: its 2nd sample).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from minipaged.utils import cdiv
from minipaged.viz.palette import PAGED, STATE_COLORS, Ink, owner_inks, series_color
from minipaged.viz.pool import PoolState, owners_from_tables, pool_grid, pool_legend, table_rows
from minipaged.viz.style import MAX_HEIGHT, MAX_WIDTH, SMALL, new_figure, new_grid

if TYPE_CHECKING:
    from minipaged.viz.snapshot import StepSnapshot

CAPTION_BOX = dict(boxstyle="round,pad=0.5", fc="#F3F3F3", ec="none")


def seq_names(snapshots: Sequence[StepSnapshot], request_name: Callable[[int], str] = "R{}".format) -> dict[int, str]:
    """seq_id -> ``R<request_id>`` for a request's first sequence, ``R<request_id>.<k>`` for its k-th sample.

    Built from the snapshots' ``scheduled`` entries (``request_name`` writes a request id); a
    sequence never scheduled is left out (pictures call it ``seq <id>``).
    """
    request: dict[int, int] = {}
    for snap in snapshots:
        for d in snap.scheduled:
            request.setdefault(d["seq_id"], d["request_id"])
    names: dict[int, str] = {}
    seen: dict[int, int] = {}  # request id -> samples named so far
    for seq_id in sorted(request):
        k = seen[request[seq_id]] = seen.get(request[seq_id], -1) + 1
        names[seq_id] = request_name(request[seq_id]) + (f".{k}" if k else "")
    return names


def _nm(seq_id: int, names: Mapping[int, str] | None) -> str:
    return (names or {}).get(seq_id, f"seq {seq_id}")


def describe_step(snapshot: StepSnapshot, names: Mapping[int, str] | None = None) -> str:
    """One line of plain text: what the step scheduled, preempted and finished, and the queues after it."""
    work = ", ".join(f"{_nm(d['seq_id'], names)} {d['kind']} {d['num_tokens']}" for d in snapshot.scheduled)
    parts = [f"step {snapshot.step}: scheduled {work or 'nothing'}"]
    if snapshot.preempted:
        parts.append("preempted " + " ".join(_nm(s, names) for s in snapshot.preempted))
    if snapshot.finished:
        parts.append("finished " + " ".join(f"R{r.request_id}" for r in snapshot.finished))
    parts.append("waiting [" + " ".join(_nm(s, names) for s in snapshot.waiting) + "]")
    parts.append("running [" + " ".join(_nm(s, names) for s in snapshot.running) + "]")
    if snapshot.ref_cnt:
        parts.append(f"free blocks {snapshot.num_free_blocks}/{len(snapshot.ref_cnt)}")
    return " | ".join(parts)


def _doing(snap: StepSnapshot, seq_id: int) -> str:
    """What ``seq_id`` did in the step of ``snap``: a :data:`STATE_COLORS` key, or ``"finished"``."""
    work = next((d for d in snap.scheduled if d["seq_id"] == seq_id), None)
    if seq_id in snap.preempted:
        return "preempted"
    if work is not None:
        return work["kind"] if seq_id in snap.running or seq_id in snap.waiting else "finished"
    return "waiting" if seq_id in snap.waiting else "idle"


def draw_step(
    snapshot: StepSnapshot,
    block_size: int | None = None,
    names: Mapping[int, str] | None = None,
    title: str | None = None,
    *,
    fig: Figure | None = None,
    inks: Mapping[Hashable, Ink] | None = None,
    caption: str = "",
    tags: Mapping[int, str] | None = None,
    notes: Sequence[str] = (),
    usage: Sequence[tuple[int, int]] = (),
) -> Figure:
    """One engine step: each sequence's block table and what it did, the queues, the pool.

    A row per sequence of the step (running, waiting, preempted or just finished): its blocks (with
    ``block_size``, the coloured part holds tokens), then what it did (``prefill 8``, ``decode 1``...).
    Beside it the queues, tokens computed, free blocks and ``notes``; below, the pool (``tags``: block
    -> a word written on it). Animation frames draw into ``fig`` (cleared first), with ``inks`` fixed
    for the run, a ``caption``, and ``usage`` ((step, blocks in use) of the run) plotted up to this step.
    """
    fig = fig or new_figure(MAX_WIDTH, MAX_HEIGHT)[0]
    fig.clear()
    ratios = [0.55] * bool(caption) + [3.0, 2.4]
    grid = fig.add_gridspec(len(ratios), 2, height_ratios=ratios, width_ratios=[2.6, 1])
    ax_t, ax_s = fig.add_subplot(grid[-2, 0]), fig.add_subplot(grid[-2, 1])
    ax_p = fig.add_subplot(grid[-1, : 2 - bool(usage)])  # the pool, beside the plot of blocks in use if any
    red = title is None and bool(snapshot.preempted)
    title = title or f"step {snapshot.step}" + " - preemption!" * red
    fig.suptitle(title, color=STATE_COLORS["preempted"] if red else "black")
    if caption:
        ax_c = fig.add_subplot(grid[0, :])
        ax_c.text(0, 0.5, textwrap.fill(caption, 125), va="center", fontsize=13, linespacing=1.3, bbox=CAPTION_BOX)
    seqs = list(dict.fromkeys([*snapshot.running, *snapshot.waiting, *snapshot.preempted]))
    seqs += [d["seq_id"] for d in snapshot.scheduled if d["seq_id"] not in seqs]  # finished in this step
    tables: dict[Hashable, list[int]] = {s: snapshot.block_tables.get(s, []) for s in seqs}
    tokens: dict[Hashable, int] = {s: snapshot.num_tokens.get(s, 0) if block_size else -1 for s in seqs}
    pool = PoolState(list(snapshot.ref_cnt), list(snapshot.cached), None, owners_from_tables(tables), tables, tokens)
    if not pool.ref_cnt:  # a contiguous engine's snapshot: no pool to read, only the tables
        pool.ref_cnt = [len(pool.owners.get(b, [])) for b in range(max(pool.owners, default=-1) + 1)]
    inks, name = inks or owner_inks(seqs), lambda s: _nm(s, names)
    work = {d["seq_id"]: d for d in snapshot.scheduled}
    doing = {s: _doing(snapshot, s) for s in seqs}
    did: dict[Hashable, str] = {
        s: f"{doing[s]} {work[s]['num_tokens']}" if s in work and doing[s] != "finished" else doing[s] for s in seqs
    }
    did |= {s: f"{doing[s]}: blocks freed" for s in seqs if doing[s] in ("preempted", "finished")}
    table_rows(ax_t, pool, block_size or 1, inks, top=len(seqs), label=name, notes=did)
    longest = max(map(len, tables.values()), default=0)
    ax_t.set(xlim=(-2.2, max(longest + 4, 9)), ylim=(min(0, len(seqs) - 5), len(seqs)))
    each = f" ({block_size} tokens each)" if block_size else ""
    ax_t.set_title(f"block tables: logical -> physical block ids{each}", loc="left", fontsize=13)

    lines = [f"running: {' '.join(map(name, snapshot.running)) or '-'}"]
    lines += [f"waiting: {' '.join(map(name, snapshot.waiting)) or '-'}"]
    lines += [f"scheduled: {len(work)} seqs, {sum(d['num_tokens'] for d in work.values())} tokens"]
    lines += [f"free blocks: {snapshot.num_free_blocks} of {len(pool.ref_cnt)}"] * bool(snapshot.ref_cnt) + [*notes]
    ax_s.text(0, 1, "\n".join(lines), va="top", fontsize=12, linespacing=1.45, transform=ax_s.transAxes)
    ax_s.set_title("queues after the step", loc="left", fontsize=13)
    if usage:
        spark, steps = fig.add_subplot(grid[-1, 1]), [x for x, _ in usage]
        spark.step(*zip(*[(x, y) for x, y in usage if x <= snapshot.step]), where="mid", color=PAGED, lw=2)
        spark.set(xlim=(min(steps) - 0.5, max(steps) + 0.5), ylim=(0, len(pool.ref_cnt)), xlabel="step")
        spark.set_title("blocks in use", loc="left", fontsize=13)
        for axis in (spark.xaxis, spark.yaxis):  # whole steps, whole blocks
            axis.set_major_locator(MaxNLocator(integer=True))
    n = len(pool.ref_cnt)
    shape = 2.6 * MAX_WIDTH / 3.6 / 2.4 if usage else MAX_WIDTH / 2.4  # the pool's width / height
    rows = max(range(1, n + 1), key=lambda r: min(shape / cdiv(n, r), 1 / r), default=1)
    ncols = cdiv(n, rows) if n else 1
    fill = pool.block_fill(block_size) if block_size else None
    pool_grid(ax_p, pool, inks, ncols, top=rows, fill=fill, tags=tags, label=name)
    ax_p.set(xlim=(0, ncols), ylim=(0, rows), aspect="equal")
    ax_p.set_title(f"pool: {n} blocks, {pool.ref_cnt.count(0)} free", loc="left", fontsize=13)
    handles = [h for h in pool_legend({}, pool) if h.get_label() != "in use"]
    ax_p.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, 0), ncols=4, frameon=False, fontsize=SMALL + 1)
    for ax in (ax_t, ax_s, ax_p) + ((ax_c,) if caption else ()):
        ax.set_axis_off()
    return fig


def draw_timeline(
    snapshots: Sequence[StepSnapshot], names: Mapping[int, str] | None = None, title: str | None = None
) -> Figure:
    """Gantt chart: one row per sequence, one column per step, coloured by what it was doing.

    Waiting (grey), prefill (orange), decode (blue), preempted (vermillion, hatched), running
    but not scheduled (pale blue); a black diamond marks the end of the step in which a sequence
    finished. A step's state comes from the snapshot it returned. Artists: one ``Rectangle`` per run
    of equal states (``ax.patches``) and one ``Line2D`` holding a marker per finished sequence.
    """
    states: dict[int, dict[int, str]] = {}  # seq_id -> {step: a STATE_COLORS key}
    finished: dict[int, int] = {}  # seq_id -> the step it finished in
    for snap in snapshots:
        work = {d["seq_id"]: d["kind"] for d in snap.scheduled}
        for seq_id in set(work) | set(snap.preempted) | set(snap.waiting) | set(snap.running):
            state = _doing(snap, seq_id)
            if state == "finished":
                state, finished[seq_id] = work[seq_id], snap.step
            states.setdefault(seq_id, {})[snap.step] = state
    names = names if names is not None else seq_names(snapshots)
    order, steps = sorted(states), [s.step for s in snapshots]
    fig, ax = new_figure(max(8.0, 0.28 * len(steps) + 3), max(3.0, 0.45 * len(order) + 1.8))
    ys = {seq_id: len(order) - 1 - row for row, seq_id in enumerate(order)}
    for seq_id in order:
        runs: list[tuple[str, int, int]] = []  # (state, first step, last step)
        for step, state in sorted(states[seq_id].items()):
            if runs and runs[-1][0] == state and runs[-1][2] == step - 1:
                runs[-1] = (state, runs[-1][1], step)
            else:
                runs.append((state, step, step))
        for state, first, last in runs:
            ec, hatch, lw = ("black", "xx", 0.8) if state == "preempted" else ("none", None, None)  # None: default
            xy = (first - 0.5, ys[seq_id] - 0.35)
            ax.add_patch(Rectangle(xy, last - first + 1, 0.7, fc=STATE_COLORS[state], ec=ec, hatch=hatch, lw=lw))
    ax.plot([finished[s] + 0.5 for s in finished], [ys[s] for s in finished], "D", color="black", markersize=7)
    ax.set_yticks(range(len(order)), [_nm(s, names) for s in reversed(order)])
    ax.set(xlim=(min(steps, default=0) - 0.6, max(steps, default=0) + 1), ylim=(-0.6, len(order) - 0.4))
    ax.set_xlabel("engine step")
    used = [k for k in STATE_COLORS if any(k in per.values() for per in states.values())]
    handles: list[Artist] = [
        Patch(fc=STATE_COLORS[k], label=k, ec="black", hatch="xx", lw=0.8)
        if k == "preempted"
        else Patch(fc=STATE_COLORS[k], label=k)
        for k in used
    ]
    handles.append(Line2D([], [], marker="D", color="black", linestyle="none", label="finished"))
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), frameon=False)
    ax.set_title(title or "requests over engine steps", loc="left")
    return fig


def during_steps(values: Sequence[int], preemptions: Sequence[int] | None = None) -> list[int]:
    """What the engine held *during* each step, from ``values`` recorded after each step.

    A record comes after its step freed what finished sequences held (0 for a contiguous cache
    whose reservations all just finished), though no step ran with that little: during step k the
    engine still held what it held after step k-1, so the value is ``max(record k-1, record k)`` —
    except in a step that preempted (``preemptions``, the running ``num_preemptions``, grew), which
    freed memory before it ran and keeps its own record.
    """
    preemptions = preemptions or [0] * len(values)
    out: list[int] = []
    prev_value, prev_preemptions = 0, 0
    for value, count in zip(values, preemptions):
        out.append(int(value) if count > prev_preemptions else max(int(value), prev_value))
        prev_value, prev_preemptions = int(value), count
    return out


def draw_kv_usage(
    paged_series: Sequence[Mapping[str, Any]],
    contiguous_series: Sequence[Mapping[str, Any]],
    capacity: int | None = None,
    title: str | None = None,
    *,
    running: tuple[Sequence[int], Sequence[int]] | None = None,
) -> Figure:
    """KV slots in use at each engine step, a paged cache against a contiguous one on the same budget.

    Each series is one ``LLM.kv_stats()`` dict per step, recorded after the step, read with
    :func:`during_steps`. Solid: slots allocated (blocks, or reservations), labelled ``"paged: slots
    allocated"``; dashed: slots holding a token; the shaded gap between them is waste. ``capacity``
    (slots in the budget) draws a line. ``running``, ``(paged, contiguous)`` running sequences after
    each step, adds a second panel.
    """
    ratios: dict[str, Any] = dict(gridspec_kw=dict(width_ratios=[1.6, 1])) if running else {}
    fig, axes = new_grid(12.4 if running else 11, 5.2, ncols=2 if running else 1, **ratios)
    ax, runs = axes[0][0], (("paged", paged_series), ("contiguous", contiguous_series))
    for label, series in runs:
        color, preempts = series_color(label), [d.get("num_preemptions", 0) for d in series]
        held = during_steps([d["tokens_held"] for d in series], preempts)
        alloc = during_steps([d["slots_allocated"] for d in series], preempts)
        x = list(range(1, len(held) + 1))
        ax.step(x, alloc, where="mid", color=color, lw=2.5, label=f"{label}: slots allocated")
        ax.step(x, held, where="mid", color=color, lw=2, ls="--", label=f"{label}: slots holding a token")
        ax.fill_between(x, held, alloc, step="mid", color=color, alpha=0.15)
        if x:
            ax.axvline(x[-1] + 0.5, color=color, lw=1.2, ls=":", label=f"{label}: done after step {x[-1]}")
    if capacity is not None:
        ax.axhline(capacity, color="black", lw=1.2, ls=(0, (1, 2)), label=f"budget: {capacity} slots")
    top = max([capacity or 0] + [int(d["slots_allocated"]) for _, s in runs for d in s] + [1])
    ax.set(xlabel="engine step", ylabel="KV slots", ylim=(0, 1.08 * top))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    ax.set_title(title or "KV memory over time, same budget", loc="left")
    if running:
        for (label, series), counts in zip(runs, running):
            ran = during_steps(counts, [d.get("num_preemptions", 0) for d in series])
            axes[0][1].step(range(1, len(ran) + 1), ran, where="mid", color=series_color(label), lw=2.2, label=label)
        axes[0][1].set(xlabel="engine step", ylabel="sequences", ylim=(0, None))
        axes[0][1].xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        axes[0][1].yaxis.set_major_locator(MaxNLocator(integer=True))  # whole sequences: no "17.5"
        axes[0][1].set_title("running sequences", loc="left")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3, frameon=False, fontsize=SMALL + 2)
    return fig
