"""Stage 4 pictures: how the Triton paged-attention kernel splits and walks its work, drawn from the
numbers of :mod:`minipaged.kernels.tiled` (the kernel's algorithm in torch). Loop step ``k`` takes the
``k``-th sequence colour. Patches carry a ``gid`` (``"program"``, ``"idle"``,
``"slot"``, ``"read"``, ``"score"``); arrows from logical to physical blocks are ``ConnectionPatch``es.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from minipaged.kernels.tiled import BlockRead, kv_tiles, online_softmax_trace, program_reads, query_tile
from minipaged.utils import cdiv
from minipaged.viz.palette import FREE, WASTE, owner_color, text_color
from minipaged.viz.slots import slot_grid
from minipaged.viz.style import SMALL, new_figure, new_grid


def _span(lo: int, hi: int) -> str:
    """``"3"`` or ``"0-7"`` for the inclusive range lo..hi."""
    return str(lo) if lo == hi else f"{lo}-{hi}"


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

    Sequences (``program_id(0)``) side by side, KV heads (``program_id(1)``) as rows, query tiles
    (``program_id(2)``) as columns inside a sequence. With ``q_lens`` (new query tokens per sequence)
    and ``block_q`` (tokens per tile) a box says which query tokens it owns
    (:func:`~minipaged.kernels.tiled.query_tile`); one with none is hatched grey: it returns at once.
    ``group`` (query heads per KV head) adds the query heads a row serves (GQA).
    """
    if min(num_seqs, num_kv_heads, num_q_tiles, block_q) < 1:
        raise ValueError("num_seqs, num_kv_heads, num_q_tiles and block_q must be >= 1")
    if q_lens is not None and len(q_lens) != num_seqs:
        raise ValueError(f"q_lens has {len(q_lens)} entries for {num_seqs} sequences")
    names = list(seq_names) if seq_names is not None else [f"seq {i}" for i in range(num_seqs)]
    cw, ch, gap = 1.6, 1.2, 0.5  # cell width / height, gap between sequences (data units)
    seq_w, total_w = num_q_tiles * cw, num_seqs * num_q_tiles * cw + (num_seqs - 1) * gap
    fig, ax = new_figure(0.75 * total_w + 2.0, max(3.4, 0.85 * num_kv_heads * ch + 2.4))
    idle_any = False
    for s in range(num_seqs):
        x0, q_len = s * (seq_w + gap), None if q_lens is None else int(q_lens[s])
        for h in range(num_kv_heads):
            for t in range(num_q_tiles):
                x, y = x0 + t * cw, (num_kv_heads - 1 - h) * ch
                tokens = range(t * block_q, (t + 1) * block_q) if q_len is None else query_tile(q_len, t, block_q)
                face = owner_color(s) if tokens else WASTE
                idle_any |= not tokens
                ec, hatch, gid = ("black", None, "program") if tokens else ("#777777", "//", "idle")
                cell = Rectangle((x + 0.05, y + 0.05), cw - 0.1, ch - 0.1, fc=face, lw=1, ec=ec, hatch=hatch, gid=gid)
                ax.add_patch(cell)
                at, ink = (x + cw / 2, y + ch * (0.72 if tokens else 0.5)), text_color(face)
                ax.text(*at, f"({s},{h},{t})", ha="center", va="center", fontsize=SMALL + 1, color=ink, weight="bold")
                if not tokens:
                    continue  # the legend says what grey means: no label repeated in every box
                lines = f"q {_span(tokens[0], tokens[-1])}"
                lines += f"\nheads {_span(h * group, h * group + group - 1)}" if group is not None else ""
                ax.text(x + cw / 2, y + ch * 0.33, lines, ha="center", va="center", fontsize=SMALL, color=ink)
        label = names[s] + ("" if q_len is None else f"\nq_len {q_len}")
        ax.text(x0 + seq_w / 2, num_kv_heads * ch + 0.12, label, ha="center", va="bottom", fontsize=SMALL + 2)
    for h in range(num_kv_heads):
        ax.text(-0.15, (num_kv_heads - 0.5 - h) * ch, f"KV head {h}", ha="right", va="center", fontsize=SMALL + 2)
    handles = [Patch(fc=owner_color(0), ec="black", label="program (seq, KV head, q tile)")]
    if idle_any:
        handles.append(Patch(fc=WASTE, hatch="//", ec="#777777", label="no queries: returns"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=len(handles), frameon=False)
    ax.set(xlim=(-1.7, total_w + 0.1), ylim=(-0.1, num_kv_heads * ch + 0.95))
    ax.set_axis_off()
    n = num_seqs * num_kv_heads * num_q_tiles
    ax.set_title(title or f"grid = ({num_seqs}, {num_kv_heads}, {num_q_tiles}): {n} programs")
    return fig


def _reads_per_block(steps: list[list[BlockRead]]) -> dict[int, tuple[set[int], set[int]]]:
    """Physical block -> (the logical blocks it is read as, the loop steps that read it): a block
    shared by two logical blocks of the table is read as both."""
    read_by: dict[int, tuple[set[int], set[int]]] = {}
    for step, reads in enumerate(steps):
        for r in reads:
            logicals, step_ids = read_by.setdefault(r.physical, (set(), set()))
            logicals.add(r.logical)
            step_ids.add(step)
    return read_by


def draw_program_reads(
    block_table: Sequence[int],
    context_len: int,
    block_size: int,
    block_n: int,
    num_blocks: int | None = None,
    kv_end: int | None = None,
    title: str | None = None,
) -> Figure:
    """One program's walk over its sequence's K/V, in KV tiles of ``block_n`` positions.

    Left, the sequence in logical order (a row per logical block, a cell per position, coloured by
    the loop step that reads it); right, the pool of ``num_blocks`` (default: just past the largest id
    used) with the slots read coloured the same way, each read block outlined and labelled with its
    logical block and step(s); an arrow per logical block to the physical block the table names.
    ``kv_end`` as in :func:`~minipaged.kernels.tiled.program_reads`.
    """
    steps = program_reads(block_table, context_len, block_size, block_n, kv_end)
    kv_end = context_len if kv_end is None else kv_end
    n_logical = cdiv(context_len, block_size)
    used = [int(b) for b in block_table[:n_logical]]
    num_blocks = max(used, default=-1) + 1 if num_blocks is None else num_blocks
    if used and max(used) >= num_blocks:
        raise ValueError(f"block table names block {max(used)} but the pool has {num_blocks}")
    tiles = kv_tiles(kv_end, block_n)
    step_of = {pos: i for i, tile in enumerate(tiles) for pos in tile}  # position -> loop step
    height = max(n_logical, num_blocks)
    ratios = dict(width_ratios=[block_size + 0.2, block_size + 4.3])
    fig, [[ax_l, ax_p]] = new_grid(max(9.0, block_size + 8.0), 0.42 * height + 2.6, ncols=2, gridspec_kw=ratios)

    def color(pos: int) -> str:
        return owner_color(step_of[pos]) if pos in step_of else FREE

    labels = {pos: str(pos) for pos in range(context_len)} if block_size <= 8 else {}
    logical = {pos: color(pos) for pos in range(context_len)}  # left: the sequence, a row per logical block
    slot_grid(ax_l, n_logical, block_size, logical, labels, empty="white", top=height)
    for j in range(n_logical):
        ax_l.text(-0.2, height - 0.5 - j, f"L{j}", ha="right", va="center", fontsize=SMALL + 2)
    ax_l.set_title(f"sequence, logical order\n({context_len} tokens, KV tiles of {block_n})", fontsize=SMALL + 3)

    # Right: the physical pool; a slot is coloured by the step that reads the position it holds.
    read_by = _reads_per_block(steps)
    physical: dict[int, int] = {}  # slot -> the first position read from it
    for pos in sorted(step_of):
        physical.setdefault(used[pos // block_size] * block_size + pos % block_size, pos)
    labels = {slot: labels[pos] for slot, pos in physical.items() if pos in labels}
    slot_grid(ax_p, num_blocks, block_size, {slot: color(pos) for slot, pos in physical.items()}, labels, top=height)
    for b in range(num_blocks):
        y = height - 1 - b
        ax_p.text(-0.2, y + 0.5, str(b), ha="right", va="center", fontsize=SMALL + 2)
        if b in read_by:
            ax_p.add_patch(Rectangle((0, y), block_size, 1, fill=False, ec="black", lw=2.2, zorder=3, gid="read"))
            logicals, stps = ",".join(f"L{i}" for i in sorted(read_by[b][0])), ",".join(map(str, sorted(read_by[b][1])))
            ax_p.text(block_size + 0.25, y + 0.5, f"{logicals}  step {stps}", ha="left", va="center", fontsize=11)
    ax_p.set_title(f"physical pool ({num_blocks} blocks x {block_size} slots)", fontsize=SMALL + 3)
    ax_p.text(-0.2, height + 0.15, "block", ha="right", va="bottom", fontsize=SMALL + 1)
    for ax, right in ((ax_l, block_size + 0.1), (ax_p, block_size + 4.2)):
        ax.set(xlim=(-0.1, right), ylim=(-0.1, height + 0.1), aspect="equal")
        ax.set_axis_off()

    for j in range(min(n_logical, cdiv(kv_end, block_size))):  # logical block -> physical block
        src, dst = (block_size + 0.1, height - 0.5 - j), (-0.6, height - 0.5 - used[j])
        arrow = ConnectionPatch(src, dst, ax_l.transData, ax_p.transData, arrowstyle="-|>", color=color(j * block_size))
        fig.add_artist(arrow).set(lw=1.6, alpha=0.9, mutation_scale=14)

    handles = [Patch(fc=owner_color(i), label=f"step {i}: pos {_span(t[0], t[-1])}") for i, t in enumerate(tiles)]
    if kv_end < context_len:
        handles.append(Patch(fc=FREE, label="not read (after the tile's last query)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), frameon=False)
    fig.suptitle(title or f"one program: block table {used}, {len(steps)} loop steps", fontsize=SMALL + 5)
    return fig


def draw_online_softmax(scores: Sequence[float] | torch.Tensor, block_n: int, title: str | None = None) -> Figure:
    """One query row's ``scores`` walked in tiles of ``block_n`` keys, in three panels (the numbers are
    :func:`~minipaged.kernels.tiled.online_softmax_trace`'s):

    1. the scores (a bar each, coloured by tile) and the running max ``m`` after each tile;
    2. the running sum ``l = l * exp(m_old - m_new) + sum(exp(s - m_new))`` after each tile (a bar
       each), the full sum ``sum(exp(s - max(s)))`` dashed: the last tile lands on it;
    3. the online probabilities ``exp(s - m) / l`` (bars) against the full softmax (dots).
    """
    tr = {k: v.tolist() for k, v in online_softmax_trace(scores, block_n).items()}
    s = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    n, tiles = s.numel(), kv_tiles(s.numel(), block_n)
    x, colors = list(range(n)), [owner_color(t) for t, tile in enumerate(tiles) for _ in tile]
    fig, [[ax1], [ax2], [ax3]] = new_grid(max(8.0, 0.3 * n + 3.0), 7.8, nrows=3)

    for bar in ax1.bar(x, s.tolist(), color=colors, edgecolor="white", width=0.85):
        bar.set_gid("score")
    for t, tile in enumerate(tiles):
        lo, hi, m = tile.start - 0.5, tile.stop - 0.5, tr["m"][t]
        ax1.hlines(m, lo, hi, color="black", lw=2.5, label="running max m" if t == 0 else "")  # "": no legend entry
        ax1.text((lo + hi) / 2, m, f"m={m:.2f}", ha="center", va="bottom", fontsize=SMALL + 1)
        if t:
            ax1.vlines(lo, tr["m"][t - 1], m, color="black", lw=2.5, linestyles=":")
            ax1.axvline(lo, color="#999999", lw=0.8, zorder=0)
    ax1.axhline(0, color="#555555", lw=0.8)
    top = tr["m"][-1]
    ax1.set(ylim=(None, top + 0.2 * (top - min(float(s.min()), 0.0)) + 0.3), ylabel="score")
    ax1.legend(loc="lower right", frameon=False)
    ax1.set_title(title or f"online softmax over {n} keys in tiles of {block_n}")

    full_sum = float(torch.exp(s - s.max()).sum())
    ax2.bar(range(len(tiles)), tr["l"], color=[owner_color(t) for t in range(len(tiles))], edgecolor="white", width=0.6)
    ax2.axhline(full_sum, color="black", ls="--", lw=1.5, label=f"full sum {full_sum:.3f}")
    for t in range(len(tiles)):
        note = f"l={tr['l'][t]:.3f}"
        if t and tr["alpha"][t] < 1.0:
            note += f"\nold l x{tr['alpha'][t]:.2f}"  # the rescale a new max forced on the old sum
        at, ink, below = (t, tr["l"][t]), text_color(owner_color(t)), (0, -4)
        ax2.annotate(
            note,
            at,
            xytext=below,
            textcoords="offset points",
            ha="center",
            va="top",
            linespacing=1.1,
            fontsize=SMALL + 1,
            color=ink,
        )
    ax2.set_xticks(range(len(tiles)), [f"after tile {t}" for t in range(len(tiles))])
    ax2.set(ylim=(0, 1.3 * max(full_sum, max(tr["l"]))), ylabel="running sum l")
    ax2.legend(loc="upper left", frameon=False)

    ax3.bar(x, tr["p_online"], color=colors, edgecolor="white", width=0.85, label="online exp(s - m) / l")
    ax3.plot(x, tr["p_full"], "o", color="black", ms=5, label="full softmax")
    err = max(abs(a - b) for a, b in zip(tr["p_online"], tr["p_full"]))
    ax3.set(xlabel="key position", ylabel="probability")
    ax3.legend(loc="upper left", frameon=False)
    ax3.set_title(f"max |online - full| = {err:.1e}", fontsize=SMALL + 3)
    for ax in (ax1, ax3):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig
