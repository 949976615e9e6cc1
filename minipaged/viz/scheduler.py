"""Stage 5 pictures: what the engine did at each step, over time, and the KV memory it held.

Pure render functions over ``StepSnapshot`` lists (what ``LLM.step()`` returns) and
``LLM.kv_stats()`` dicts:

- :func:`draw_step`: one step's queues, scheduled work, block tables and pool;
- :func:`draw_timeline`: a Gantt chart of every sequence over the steps;
- :func:`draw_kv_usage`: KV slots over the steps, paged against contiguous on one budget.

Sequences are named by :func:`seq_names` (``R3`` = request 3; ``R3.1`` = its second sample).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from minipaged.viz.palette import FREE, MUTED, STATE_COLORS, WASTE, Ink, owner_inks, series_color
from minipaged.viz.style import SMALL, new_figure

PREEMPT = STATE_COLORS["preempted"]


def seq_names(snapshots: Sequence) -> dict[int, str]:
    """seq_id -> ``R<request_id>`` (``R<request_id>.<k>`` for the k-th sequence of a request with several).

    Built from the snapshots' ``scheduled`` entries; a sequence never scheduled keeps ``seq <id>``.
    """
    request: dict[int, int] = {}
    for snap in snapshots:
        for d in snap.scheduled:
            request[d["seq_id"]] = d["request_id"]
    by_request: dict[int, list[int]] = {}
    for seq_id in sorted(request):
        by_request.setdefault(request[seq_id], []).append(seq_id)
    names = {}
    for rid, seqs in by_request.items():
        for k, seq_id in enumerate(seqs):
            names[seq_id] = f"R{rid}" if len(seqs) == 1 else f"R{rid}.{k}"
    return names


def _nm(seq_id: int, names: Mapping[int, str] | None) -> str:
    return (names or {}).get(seq_id, f"seq {seq_id}")


def describe_step(snapshot, names: Mapping[int, str] | None = None) -> str:
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


def _box(
    ax,
    x: float,
    y: float,
    w: float,
    h: float,
    text: str,
    ink: Ink,
    edge: str = "black",
    lw: float = 1,
    fontsize: int = 12,
) -> None:
    ax.add_patch(Rectangle((x, y), w, h, facecolor=ink.color, hatch=ink.hatch, edgecolor=edge, lw=lw))
    ax.text(
        x + w / 2,
        y + h / 2,
        text,
        ha="center",
        va="center",
        fontsize=fontsize,
        color=ink.text,
        fontweight="bold" if ink.text == "white" else "normal",
    )


def _clean(ax) -> None:
    ax.set_axis_off()


def draw_step(
    snapshot,
    block_size: int | None = None,
    names: Mapping[int, str] | None = None,
    title: str | None = None,
) -> Figure:
    """One engine step: queues after it, what ran, each live sequence's block table, the pool.

    Four panels: queues (waiting / running, preempted sequences outlined in red), the scheduled
    work (prefill / decode and token counts), block tables (with ``block_size`` the last block
    shows how full it is) and the pool (blocks coloured by owner; free blocks grey).
    """
    fig, axes = new_figure(
        12.6, 7.4, nrows=2, ncols=2, gridspec_kw=dict(height_ratios=[1, 1.5], width_ratios=[1.25, 1])
    )
    (ax_q, ax_s), (ax_t, ax_p) = axes
    preempted = set(snapshot.preempted)
    scheduled = {d["seq_id"]: d for d in snapshot.scheduled}
    inks = owner_inks([*scheduled, *snapshot.running, *snapshot.block_tables])  # alive in this step: all different

    # Queues.
    w, h = 1.6, 0.8
    for row, (label, ids) in enumerate((("waiting", snapshot.waiting), ("running", snapshot.running))):
        y = 1.2 - row * 1.2
        ax_q.text(-0.2, y + h / 2, label, ha="right", va="center", fontsize=13)
        for i, seq_id in enumerate(ids):
            d = scheduled.get(seq_id)
            ink = inks[seq_id] if label == "running" else Ink(STATE_COLORS["waiting"])
            text = _nm(seq_id, names) + (f"\n{d['kind'][0].upper()}{d['num_tokens']}" if d else "")
            red = seq_id in preempted
            _box(
                ax_q,
                i * (w + 0.2),
                y,
                w,
                h,
                text,
                ink,
                edge=PREEMPT if red else "black",
                lw=3.5 if red else 1,
                fontsize=SMALL + 1,
            )
        if not ids:
            ax_q.text(0, y + h / 2, "(empty)", va="center", fontsize=12, color=MUTED)
    ax_q.set_xlim(-2.0, max(6, max(len(snapshot.waiting), len(snapshot.running))) * (w + 0.2))
    ax_q.set_ylim(-0.2, 2.2)
    _clean(ax_q)
    ax_q.set_title("queues after the step", loc="left")

    # What ran.
    lines = [
        (
            f"{_nm(d['seq_id'], names)}: {d['kind']} of {d['num_tokens']} token{'s' * (d['num_tokens'] != 1)}",
            inks[d["seq_id"]].color,
        )
        for d in snapshot.scheduled
    ]
    lines += [(f"{_nm(s, names)}: preempted, blocks freed", PREEMPT) for s in snapshot.preempted]
    lines += [(f"R{r.request_id}: finished", "black") for r in snapshot.finished]
    total = sum(d["num_tokens"] for d in snapshot.scheduled)
    for i, (text, color) in enumerate(lines or [("nothing scheduled", MUTED)]):
        y = 1 - (i + 0.5) / max(len(lines), 6)
        ax_s.add_patch(Rectangle((0, y - 0.035), 0.03, 0.07, color=color, transform=ax_s.transAxes))
        ax_s.text(
            0.05,
            y,
            text,
            va="center",
            fontsize=12,
            color=PREEMPT if color == PREEMPT else "black",
            fontweight="bold" if color == PREEMPT else "normal",
            transform=ax_s.transAxes,
        )
    _clean(ax_s)
    ax_s.set_title(f"scheduled: {len(snapshot.scheduled)} seqs, {total} tokens", loc="left")

    # Block tables.
    live = list(snapshot.block_tables)
    bw, nrows = 1.0, max(len(live), 4)
    for r, seq_id in enumerate(live):
        y = nrows - 1 - r  # first row at the top
        table = snapshot.block_tables[seq_id]
        ntok = snapshot.num_tokens.get(seq_id, 0)
        ax_t.text(-0.3, y + 0.4, _nm(seq_id, names), ha="right", va="center", fontsize=12)
        for j, block in enumerate(table):
            fill = 1.0
            if block_size:
                fill = max(0.0, min(1.0, (ntok - j * block_size) / block_size))
            ax_t.add_patch(Rectangle((j * bw, y), bw * 0.92, 0.8, facecolor="white", edgecolor="black", lw=1))
            if fill > 0:
                ax_t.add_patch(
                    Rectangle(
                        (j * bw, y),
                        bw * 0.92 * fill,
                        0.8,
                        facecolor=inks[seq_id].color,
                        hatch=inks[seq_id].hatch,
                        edgecolor="none",
                    )
                )
            ax_t.text(
                j * bw + 0.46,
                y + 0.4,
                str(block),
                ha="center",
                va="center",
                fontsize=SMALL + 1,
                color=inks[seq_id].text if fill > 0.5 else "black",
            )
    width = max([len(t) for t in snapshot.block_tables.values()] + [4])
    ax_t.set_xlim(-2.0, width * bw + 0.2)
    ax_t.set_ylim(-0.3, nrows)
    _clean(ax_t)
    if not live:
        ax_t.text(0, nrows - 0.6, "(no live sequence)", fontsize=12, color=MUTED)
    sub = f" (tokens: {block_size} per block)" if block_size else ""
    ax_t.set_title("block tables: logical -> physical" + sub, loc="left")

    # Pool.
    owner: dict[int, int] = {}
    for seq_id, table in snapshot.block_tables.items():
        for b in table:
            owner.setdefault(b, seq_id)
    num_blocks = len(snapshot.ref_cnt) or (max(owner) + 1 if owner else 0)
    cols = min(8, max(1, num_blocks))
    rows = -(-num_blocks // cols) if num_blocks else 1
    for b in range(num_blocks):
        x, y = b % cols, rows - 1 - b // cols
        shared = bool(snapshot.ref_cnt) and snapshot.ref_cnt[b] > 1
        if b in owner:
            _box(
                ax_p, x, y, 0.9, 0.9, str(b), inks[owner[b]], edge="black", lw=2.5 if shared else 1, fontsize=SMALL + 1
            )
        else:
            _box(ax_p, x, y, 0.9, 0.9, str(b), Ink(FREE), edge=WASTE, fontsize=SMALL + 1)
    ax_p.set_xlim(-0.1, cols)
    ax_p.set_ylim(-0.1, max(rows, 1))
    ax_p.set_aspect("equal")
    _clean(ax_p)
    free = snapshot.num_free_blocks if snapshot.ref_cnt else num_blocks - len(owner)
    ax_p.set_title(f"pool: {num_blocks} blocks, {free} free", loc="left")

    fig.suptitle(
        title or f"step {snapshot.step}" + (" - preemption!" if snapshot.preempted else ""),
        color=PREEMPT if snapshot.preempted else "black",
    )
    return fig


def timeline_states(snapshots: Sequence) -> tuple[dict[int, dict[int, str]], dict[int, int]]:
    """(seq_id -> {step: state}, seq_id -> the step it finished), state being a ``STATE_COLORS`` key.

    A step's state comes from the snapshot it returned: scheduled (prefill / decode), preempted,
    waiting, or running but not scheduled (``idle``). A sequence that ran in a step and is
    neither waiting nor running after it finished in that step.
    """
    states: dict[int, dict[int, str]] = {}
    finished: dict[int, int] = {}
    for snap in snapshots:
        scheduled = {d["seq_id"]: d["kind"] for d in snap.scheduled}
        waiting, running = set(snap.waiting), set(snap.running)
        for seq_id in set(scheduled) | set(snap.preempted) | waiting | running:
            if seq_id in snap.preempted:
                state = "preempted"
            elif seq_id in scheduled:
                state = scheduled[seq_id]
                if seq_id not in waiting and seq_id not in running:
                    finished[seq_id] = snap.step
            elif seq_id in waiting:
                state = "waiting"
            else:
                state = "idle"
            states.setdefault(seq_id, {})[snap.step] = state
    return states, finished


def draw_timeline(snapshots: Sequence, names: Mapping[int, str] | None = None, title: str | None = None) -> Figure:
    """Gantt chart: one row per sequence, one column per step, coloured by what it was doing.

    Waiting (grey), prefill (orange), decode (blue), preempted (vermillion, hatched), running
    but not scheduled (pale blue); a black diamond marks the end of the step in which a sequence
    finished. Artists: one ``Rectangle`` per run of equal states (``ax.patches``) and one
    ``Line2D`` holding a marker per finished sequence.
    """
    states, finished = timeline_states(snapshots)
    names = names if names is not None else seq_names(snapshots)
    order = sorted(states)
    steps = [s.step for s in snapshots]
    fig, ax = new_figure(max(8.0, 0.28 * len(steps) + 3), max(3.0, 0.45 * len(order) + 1.8))
    for row, seq_id in enumerate(order):
        y = len(order) - 1 - row
        runs: list[list] = []  # [state, first step, last step]
        for step, state in sorted(states[seq_id].items()):
            if runs and runs[-1][0] == state and runs[-1][2] == step - 1:
                runs[-1][2] = step
            else:
                runs.append([state, step, step])
        for state, first, last in runs:
            hatched = state == "preempted"
            ax.add_patch(
                Rectangle(
                    (first - 0.5, y - 0.35),
                    last - first + 1,
                    0.7,
                    facecolor=STATE_COLORS[state],
                    edgecolor="black" if hatched else "none",
                    hatch="xx" if hatched else None,
                    lw=0.8,
                )
            )
    ys = {seq_id: len(order) - 1 - row for row, seq_id in enumerate(order)}
    ax.plot(
        [finished[s] + 0.5 for s in finished],
        [ys[s] for s in finished],
        "D",
        color="black",
        markersize=7,
        linestyle="none",
    )
    ax.set_yticks(range(len(order)), [_nm(s, names) for s in reversed(order)])
    ax.set_xlim(min(steps, default=0) - 0.6, max(steps, default=0) + 1)
    ax.set_ylim(-0.6, len(order) - 0.4)
    ax.set_xlabel("engine step")
    used = {st for per in states.values() for st in per.values()}
    handles = [
        Patch(
            facecolor=STATE_COLORS[k],
            label=k,
            hatch="xx" if k == "preempted" else None,
            edgecolor="black" if k == "preempted" else "none",
        )
        for k in STATE_COLORS
        if k in used
    ]
    handles.append(Line2D([], [], marker="D", color="black", linestyle="none", label="finished"))
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), frameon=False)
    ax.set_title(title or "requests over engine steps", loc="left")
    return fig


def during_steps(values: Sequence[int], preemptions: Sequence[int] | None = None) -> list[int]:
    """What the engine held *during* each step, from ``values`` recorded after each step.

    Records come after a step has freed what its finished sequences held, and new requests are
    admitted at the next step's schedule, so a record can be low (0 for a contiguous cache whose
    reservations all just finished) although no step ever ran with that little. During step k the
    engine still held what it held after step k-1 (finished sequences free at the end of the
    step), so the value is ``max(record k-1, record k)`` — except in a step that preempted
    (``preemptions``, the running count of ``kv_stats()["num_preemptions"]``, grew): preemption
    frees memory before the step runs, so that step keeps its own record.
    """
    preemptions = preemptions or [0] * len(values)
    out, prev_value, prev_preemptions = [], 0, 0
    for value, count in zip(values, preemptions):
        out.append(int(value) if count > prev_preemptions else max(int(value), prev_value))
        prev_value, prev_preemptions = int(value), count
    return out


def draw_kv_usage(
    paged_series: Sequence[Mapping],
    contiguous_series: Sequence[Mapping],
    capacity: int | None = None,
    title: str | None = None,
    *,
    running: tuple[Sequence[int], Sequence[int]] | None = None,
) -> Figure:
    """KV slots in use at each engine step, a paged cache against a contiguous one on the same budget.

    Each series is one ``LLM.kv_stats()`` dict per step, recorded after the step (``tokens_held``,
    ``slots_allocated``, ``num_preemptions``), read with :func:`during_steps`. Solid steps: slots
    allocated (blocks, or reservations); dashed: slots holding a token; the shaded gap between them
    is waste. ``capacity`` (slots in the budget) draws a horizontal line. ``running``: the number
    of running sequences after each step, ``(paged, contiguous)``: adds a second panel.

    Artists: in the first axes, one ``Line2D`` per series and kind (labels ``"paged: slots
    allocated"``, ``"paged: slots holding a token"``, ...), the capacity line, and a dotted
    vertical line at each run's last step.
    """
    fig, axes = new_figure(
        12.4 if running else 11,
        5.2,
        ncols=2 if running else 1,
        squeeze=False,
        gridspec_kw=dict(width_ratios=[1.6, 1]) if running else None,
    )
    ax = axes[0, 0]
    runs = (("paged", paged_series), ("contiguous", contiguous_series))
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
    ax.set_xlabel("engine step")
    ax.set_ylabel("KV slots")
    ax.set_ylim(0, 1.08 * max([capacity or 0] + [int(d["slots_allocated"]) for _, s in runs for d in s] + [1]))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    ax.set_title(title or "KV memory over time, same budget", loc="left")
    if running:
        ax_r = axes[0, 1]
        for (label, series), counts in zip(runs, running):
            ran = during_steps(counts, [d.get("num_preemptions", 0) for d in series])
            ax_r.step(range(1, len(ran) + 1), ran, where="mid", color=series_color(label), lw=2.2, label=label)
        ax_r.set_xlabel("engine step")
        ax_r.set_ylabel("sequences")
        ax_r.set_ylim(bottom=0)
        ax_r.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        ax_r.yaxis.set_major_locator(MaxNLocator(integer=True))  # whole sequences: no "17.5"
        ax_r.set_title("running sequences", loc="left")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3, frameon=False, fontsize=SMALL + 2)
    return fig
