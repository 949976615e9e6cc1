"""Stage 4 pictures: how the Triton paged-attention kernel splits and walks its work.

The numbers come from :mod:`minipaged.kernels.tiled` (the kernel's algorithm in torch); these
functions only draw them (plain state in, ``Figure`` out, nothing shown):

- :func:`draw_launch_grid`: the launch grid ``(num_seqs, num_kv_heads, num_q_tiles)``, one box
  per program, saying which sequence, KV head (and its query-head group) and query tile it
  owns; programs with no queries (past a short sequence's last tile) return at once;
- :func:`draw_program_reads`: one program's walk over the context in KV tiles of ``block_n``
  positions: which physical blocks of the pool it reads, at which loop step, through the block
  table (:func:`~minipaged.kernels.tiled.program_reads`);
- :func:`draw_online_softmax`: the running max and running sum updated tile by tile, and the
  resulting probabilities against the full softmax
  (:func:`~minipaged.kernels.tiled.online_softmax_trace`).

Patches carry a ``gid`` (``"program"``, ``"idle"``, ``"logical"``, ``"slot"``, ``"read"``,
``"score"``) so tests can count them; the arrows from logical to physical blocks are
``ConnectionPatch`` artists of the figure.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from minipaged.kernels.tiled import kv_tiles, online_softmax_trace, program_reads, query_tile
from minipaged.utils import cdiv
from minipaged.viz.palette import FREE, WASTE, owner_color, step_color, text_color
from minipaged.viz.style import SMALL, new_figure

__all__ = ["draw_launch_grid", "draw_online_softmax", "draw_program_reads", "online_softmax_trace", "program_reads"]

IDLE = WASTE


def _span(lo: int, hi: int) -> str:
    """``"3"`` or ``"0-7"`` for the inclusive range lo..hi."""
    return str(lo) if lo == hi else f"{lo}-{hi}"


# ---------------------------------------------------------------------------------------------
# The launch grid


def draw_launch_grid(
    num_seqs: int,
    num_kv_heads: int,
    num_q_tiles: int,
    q_lens: Sequence[int] | None = None,
    block_q: int = 1,
    group: int | None = None,
    seq_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """One box per program of the grid ``(num_seqs, num_kv_heads, num_q_tiles)``.

    Sequences (``program_id(0)``) are side by side, KV heads (``program_id(1)``) are rows, query
    tiles (``program_id(2)``) are columns inside a sequence. ``q_lens`` (new query tokens per
    sequence) and ``block_q`` (query tokens per tile) label each box with the query tokens it
    owns (:func:`~minipaged.kernels.tiled.query_tile`); a tile with none is drawn hatched
    grey: that program returns at once. ``group`` (query heads per KV head) adds the query heads
    each row serves (GQA).

    Artists: one ``Rectangle`` per program (``gid`` ``"program"`` or ``"idle"``).
    """
    if min(num_seqs, num_kv_heads, num_q_tiles) < 1:
        raise ValueError("num_seqs, num_kv_heads and num_q_tiles must be >= 1")
    if q_lens is not None and len(q_lens) != num_seqs:
        raise ValueError(f"q_lens has {len(q_lens)} entries for {num_seqs} sequences")
    if block_q < 1:
        raise ValueError(f"block_q must be >= 1, got {block_q}")
    names = list(seq_names) if seq_names is not None else [f"seq {i}" for i in range(num_seqs)]
    cw, ch, gap = 1.6, 1.2, 0.5  # cell width / height, gap between sequences (data units)
    seq_w = num_q_tiles * cw
    total_w = num_seqs * seq_w + (num_seqs - 1) * gap
    fig, ax = new_figure(0.75 * total_w + 2.0, max(3.4, 0.85 * num_kv_heads * ch + 2.4))
    idle_any = False
    for s in range(num_seqs):
        x0 = s * (seq_w + gap)
        q_len = None if q_lens is None else int(q_lens[s])
        for h in range(num_kv_heads):
            y = (num_kv_heads - 1 - h) * ch
            for t in range(num_q_tiles):
                x = x0 + t * cw
                tokens = range(t * block_q, (t + 1) * block_q) if q_len is None else query_tile(q_len, t, block_q)
                box = (x + 0.05, y + 0.05), cw - 0.1, ch - 0.1
                if not tokens:
                    idle_any = True
                    ax.add_patch(Rectangle(*box, facecolor=IDLE, edgecolor="#777777", hatch="//", lw=1, gid="idle"))
                    ax.text(x + cw / 2, y + ch / 2, f"({s},{h},{t})", ha="center", va="center", fontsize=SMALL + 1)
                    continue  # the legend says what grey means: no label repeated in every box
                face = owner_color(s)
                ax.add_patch(Rectangle(*box, facecolor=face, edgecolor="black", lw=1, gid="program"))
                ax.text(
                    x + cw / 2,
                    y + ch * 0.72,
                    f"({s},{h},{t})",
                    ha="center",
                    va="center",
                    fontsize=SMALL + 1,
                    color=text_color(face),
                    fontweight="bold",
                )
                lines = [f"q {_span(tokens[0], tokens[-1])}"]
                if group is not None:
                    lines.append(f"heads {_span(h * group, h * group + group - 1)}")
                ax.text(
                    x + cw / 2,
                    y + ch * 0.33,
                    "\n".join(lines),
                    ha="center",
                    va="center",
                    fontsize=SMALL,
                    color=text_color(face),
                    linespacing=1.1,
                )
        label = names[s] + ("" if q_len is None else f"\nq_len {q_len}")
        ax.text(x0 + seq_w / 2, num_kv_heads * ch + 0.12, label, ha="center", va="bottom", fontsize=SMALL + 2)
    for h in range(num_kv_heads):
        ax.text(
            -0.15, (num_kv_heads - 1 - h) * ch + ch / 2, f"KV head {h}", ha="right", va="center", fontsize=SMALL + 2
        )
    handles = [Patch(facecolor=owner_color(0), edgecolor="black", label="program (seq, KV head, q tile)")]
    if idle_any:
        handles.append(Patch(facecolor=IDLE, hatch="//", edgecolor="#777777", label="no queries: returns"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=len(handles), frameon=False)
    ax.set_xlim(-1.7, total_w + 0.1)
    ax.set_ylim(-0.1, num_kv_heads * ch + 0.95)
    ax.set_axis_off()
    n = num_seqs * num_kv_heads * num_q_tiles
    ax.set_title(title or f"grid = ({num_seqs}, {num_kv_heads}, {num_q_tiles}): {n} programs")
    return fig


# ---------------------------------------------------------------------------------------------
# One program's reads


def draw_program_reads(
    block_table: Sequence[int],
    context_len: int,
    block_size: int,
    block_n: int,
    num_blocks: int | None = None,
    kv_end: int | None = None,
    title: str | None = None,
) -> Figure:
    """One program's walk over its sequence's K/V: left, the sequence in logical order (one row
    per logical block, one cell per position, coloured by the loop step that reads it); right,
    the physical pool (one row per block) with the slots read coloured the same way and each
    read block labelled with its logical block and step(s); an arrow per logical block goes to
    the physical block the table names. Positions are written in the cells of blocks of up to 8.

    ``num_blocks`` is the pool size (default: just past the largest id used); ``kv_end`` as in
    :func:`~minipaged.kernels.tiled.program_reads`.

    Artists: one ``Rectangle`` per logical position (``gid`` ``"logical"``) and per pool slot
    (``"slot"``), one outline per read physical block (``"read"``), one ``ConnectionPatch`` per
    logical block read.
    """
    steps = program_reads(block_table, context_len, block_size, block_n, kv_end)
    kv_end = context_len if kv_end is None else kv_end
    n_logical = cdiv(context_len, block_size)
    used = [int(b) for b in block_table[:n_logical]]
    num_blocks = max(used, default=-1) + 1 if num_blocks is None else num_blocks
    if used and max(used) >= num_blocks:
        raise ValueError(f"block table names block {max(used)} but the pool has {num_blocks}")
    step_of = {pos: i for i, tile in enumerate(kv_tiles(kv_end, block_n)) for pos in tile}  # position -> loop step
    height = max(n_logical, num_blocks)
    fig, (ax_l, ax_p) = new_figure(
        max(9.0, block_size + 8.0),
        0.42 * height + 2.6,
        ncols=2,
        gridspec_kw=dict(width_ratios=[block_size + 0.2, block_size + 4.3]),
    )
    labelled = block_size <= 8

    def slot_box(ax, o, y, face, gid, label=None):
        ax.add_patch(Rectangle((o, y), 1, 1, facecolor=face, edgecolor="white", lw=1.2, gid=gid))
        if label is not None and labelled:
            ax.text(o + 0.5, y + 0.5, label, ha="center", va="center", fontsize=SMALL, color=text_color(face))

    # Left: logical view of the sequence.
    for j in range(n_logical):
        y = height - 1 - j
        for o in range(block_size):
            pos = j * block_size + o
            if pos >= context_len:
                slot_box(ax_l, o, y, "white", "logical")
            else:
                slot_box(ax_l, o, y, step_color(step_of[pos]) if pos in step_of else FREE, "logical", str(pos))
        ax_l.text(-0.2, y + 0.5, f"L{j}", ha="right", va="center", fontsize=SMALL + 2)
    ax_l.set_title(f"sequence, logical order\n({context_len} tokens, KV tiles of {block_n})", fontsize=SMALL + 3)

    # Right: the physical pool; a slot is coloured by the step that reads the position it holds.
    read_by: dict[int, tuple[set[int], set[int]]] = {}  # physical block -> (logical blocks, steps)
    for step, reads in enumerate(steps):
        for r in reads:
            logicals, stps = read_by.setdefault(r.physical, (set(), set()))
            logicals.add(r.logical)
            stps.add(step)
    slot_pos = {}  # (block, offset) -> the first position read from it
    for pos in sorted(step_of):
        slot_pos.setdefault((used[pos // block_size], pos % block_size), pos)
    for b in range(num_blocks):
        y = height - 1 - b
        for o in range(block_size):
            pos = slot_pos.get((b, o))
            if pos is None:
                slot_box(ax_p, o, y, FREE, "slot")
            else:
                slot_box(ax_p, o, y, step_color(step_of[pos]), "slot", str(pos))
        ax_p.text(-0.2, y + 0.5, str(b), ha="right", va="center", fontsize=SMALL + 2)
        if b in read_by:
            ax_p.add_patch(
                Rectangle((0, y), block_size, 1, fill=False, edgecolor="black", lw=2.2, zorder=3, gid="read")
            )
            logicals, stps = read_by[b]
            label = ",".join(f"L{lg}" for lg in sorted(logicals)) + "  step " + ",".join(map(str, sorted(stps)))
            ax_p.text(block_size + 0.25, y + 0.5, label, ha="left", va="center", fontsize=SMALL + 1)
    ax_p.set_title(f"physical pool ({num_blocks} blocks x {block_size} slots)", fontsize=SMALL + 3)

    for ax in (ax_l, ax_p):
        ax.set_xlim(-0.1, block_size + 0.1)
        ax.set_ylim(-0.1, height + 0.1)
        ax.set_aspect("equal")
        ax.set_axis_off()
    ax_p.set_xlim(-0.1, block_size + 4.2)
    ax_p.text(-0.2, height + 0.15, "block", ha="right", va="bottom", fontsize=SMALL + 1)

    # Arrows: logical block -> physical block, coloured by the step that first reads it.
    for j in range(min(n_logical, cdiv(kv_end, block_size))):
        arrow = ConnectionPatch(
            xyA=(block_size + 0.1, height - 1 - j + 0.5),
            coordsA=ax_l.transData,
            xyB=(-0.6, height - 1 - used[j] + 0.5),
            coordsB=ax_p.transData,
            arrowstyle="-|>",
            mutation_scale=14,
            color=step_color(step_of[j * block_size]),
            lw=1.6,
            alpha=0.9,
        )
        fig.add_artist(arrow)

    handles = [
        Patch(facecolor=step_color(i), label=f"step {i}: pos {_span(tile[0], tile[-1])}")
        for i, tile in enumerate(kv_tiles(kv_end, block_n))
    ]
    if kv_end < context_len:
        handles.append(Patch(facecolor=FREE, label="not read (after the tile's last query)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), frameon=False)
    fig.suptitle(title or f"one program: block table {used}, {len(steps)} loop steps", fontsize=SMALL + 5)
    return fig


# ---------------------------------------------------------------------------------------------
# Online softmax


def draw_online_softmax(scores: Sequence[float] | torch.Tensor, block_n: int, title: str | None = None) -> Figure:
    """Three stacked panels for one query row's ``scores`` walked in tiles of ``block_n`` keys:

    1. the scores (bars coloured by tile) and the running max ``m`` after each tile (a step line);
    2. the running sum ``l`` after each tile (``l = l * exp(m_old - m_new) + sum(exp(s - m_new))``),
       with the full sum ``sum(exp(s - max(s)))`` dashed: the last tile lands on it;
    3. the online probabilities ``exp(s - m) / l`` (bars) against the full softmax (dots).

    The numbers are :func:`~minipaged.kernels.tiled.online_softmax_trace`'s. Artists:
    ``len(scores)`` bars (``gid`` ``"score"``) in panel 1 and ``len(scores)`` in panel 3, one bar
    per tile in panel 2.
    """
    tr = {k: v.tolist() for k, v in online_softmax_trace(scores, block_n).items()}
    s = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    n, tiles = s.numel(), kv_tiles(s.numel(), block_n)
    x = list(range(n))
    colors = [step_color(t) for t, tile in enumerate(tiles) for _ in tile]
    fig, (ax1, ax2, ax3) = new_figure(max(8.0, 0.3 * n + 3.0), 7.8, nrows=3)

    bars = ax1.bar(x, s.tolist(), color=colors, edgecolor="white", width=0.85)
    for b in bars:
        b.set_gid("score")
    for t, tile in enumerate(tiles):
        lo, hi = tile.start - 0.5, tile.stop - 0.5
        ax1.hlines(tr["m"][t], lo, hi, color="black", lw=2.5, label="running max m" if t == 0 else None)
        ax1.text((lo + hi) / 2, tr["m"][t], f"m={tr['m'][t]:.2f}", ha="center", va="bottom", fontsize=SMALL + 1)
        if t:
            ax1.vlines(lo, tr["m"][t - 1], tr["m"][t], color="black", lw=2.5, linestyles=":")
            ax1.axvline(lo, color="#999999", lw=0.8, zorder=0)
    ax1.axhline(0, color="#555555", lw=0.8)
    top = tr["m"][-1]
    ax1.set_ylim(top=top + 0.2 * (top - min(float(s.min()), 0.0)) + 0.3)
    ax1.set_ylabel("score")
    ax1.legend(loc="lower right", frameon=False)
    for ax in (ax1, ax3):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_title(title or f"online softmax over {n} keys in tiles of {block_n}")

    full_sum = float(torch.exp(s - s.max()).sum())
    ax2.bar(range(len(tiles)), tr["l"], color=[step_color(t) for t in range(len(tiles))], edgecolor="white", width=0.6)
    ax2.axhline(full_sum, color="black", ls="--", lw=1.5, label=f"full sum {full_sum:.3f}")
    for t in range(len(tiles)):
        note = f"l={tr['l'][t]:.3f}"
        if t and tr["alpha"][t] < 1.0:
            note += f"\nold l x{tr['alpha'][t]:.2f}"  # the rescale a new max forced on the old sum
        ax2.annotate(
            note,
            (t, tr["l"][t]),
            xytext=(0, -4),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=SMALL + 1,
            linespacing=1.1,
            color=text_color(step_color(t)),
        )  # inside the bar
    ax2.set_xticks(range(len(tiles)), [f"after tile {t}" for t in range(len(tiles))])
    ax2.set_ylim(0, 1.3 * max(full_sum, max(tr["l"])))
    ax2.set_ylabel("running sum l")
    ax2.legend(loc="upper left", frameon=False)

    ax3.bar(x, tr["p_online"], color=colors, edgecolor="white", width=0.85, label="online exp(s - m) / l")
    ax3.plot(x, tr["p_full"], "o", color="black", ms=5, label="full softmax")
    err = max(abs(a - b) for a, b in zip(tr["p_online"], tr["p_full"]))
    ax3.set_xlabel("key position")
    ax3.set_ylabel("probability")
    ax3.legend(loc="upper left", frameon=False)
    ax3.set_title(f"max |online - full| = {err:.1e}", fontsize=SMALL + 3)
    return fig
