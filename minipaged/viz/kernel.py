"""Stage 4 pictures: how the Triton paged-attention kernel splits and walks its work.

Pure render functions (plain state in, ``Figure`` out, nothing shown):

- :func:`draw_launch_grid`: the launch grid ``(num_seqs, num_kv_heads, num_q_tiles)``, one box
  per program, saying which sequence, KV head (and its query-head group) and query tile it
  owns; programs with no queries (past a short sequence's last tile) return at once;
- :func:`draw_program_reads`: one program's walk over the context in KV tiles of ``block_n``
  positions: which physical blocks of the pool it reads, at which loop step, through the block
  table;
- :func:`draw_online_softmax`: the running max and running sum updated tile by tile, and the
  resulting probabilities against the full softmax.

Patches carry a ``gid`` (``"program"``, ``"idle"``, ``"logical"``, ``"slot"``, ``"read"``,
``"score"``) so tests can count them; the arrows from logical to physical blocks are
``ConnectionPatch`` artists of the figure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from minipaged.viz.style import FREE, PALETTE, WASTE, new_figure, owner_color

IDLE = WASTE


def _text_color(fill: str) -> str:
    r, g, b = to_rgb(fill)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"


def _span(lo: int, hi: int) -> str:
    """``"3"`` or ``"0-7"`` for the inclusive range lo..hi."""
    return str(lo) if lo == hi else f"{lo}-{hi}"


def step_color(step: int) -> str:
    """The colour of KV-tile loop step ``step`` (shared by the pool and the softmax pictures)."""
    return PALETTE[step % (len(PALETTE) - 1)]


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
    owns; a tile starting at or past ``q_len`` is drawn hatched grey: that program returns at
    once. ``group`` (query heads per KV head) adds the query heads each row serves (GQA).

    Artists: one ``Rectangle`` per program (``gid`` ``"program"`` or ``"idle"``).
    """
    if min(num_seqs, num_kv_heads, num_q_tiles) < 1:
        raise ValueError("num_seqs, num_kv_heads and num_q_tiles must be >= 1")
    if q_lens is not None and len(q_lens) != num_seqs:
        raise ValueError(f"q_lens has {len(q_lens)} entries for {num_seqs} sequences")
    if block_q < 1:
        raise ValueError(f"block_q must be >= 1, got {block_q}")
    names = list(seq_names) if seq_names is not None else [f"seq {i}" for i in range(num_seqs)]
    cw, ch, gap = 1.6, 1.1, 0.5  # cell width / height, gap between sequences (data units)
    seq_w = num_q_tiles * cw
    total_w = num_seqs * seq_w + (num_seqs - 1) * gap
    fig, ax = new_figure(max(7.0, 0.8 * total_w + 2.0), max(3.2, 0.8 * num_kv_heads * ch + 2.3))
    idle_any = False
    for s in range(num_seqs):
        x0 = s * (seq_w + gap)
        q_len = None if q_lens is None else int(q_lens[s])
        for h in range(num_kv_heads):
            y = (num_kv_heads - 1 - h) * ch
            for t in range(num_q_tiles):
                x = x0 + t * cw
                lo = t * block_q
                idle = q_len is not None and lo >= q_len
                idle_any |= idle
                if idle:
                    rect = Rectangle((x + 0.05, y + 0.05), cw - 0.1, ch - 0.1, facecolor=IDLE, edgecolor="#777777",
                                     hatch="//", lw=1, gid="idle")
                    ax.add_patch(rect)
                    ax.text(x + cw / 2, y + ch * 0.62, f"({s},{h},{t})", ha="center", va="center", fontsize=11)
                    ax.text(x + cw / 2, y + ch * 0.3, "returns", ha="center", va="center", fontsize=10,
                            color="#333333")
                    continue
                face = owner_color(s)
                ax.add_patch(Rectangle((x + 0.05, y + 0.05), cw - 0.1, ch - 0.1, facecolor=face, edgecolor="black",
                                       lw=1, gid="program"))
                fg = _text_color(face)
                ax.text(x + cw / 2, y + ch * 0.7, f"({s},{h},{t})", ha="center", va="center", fontsize=11,
                        color=fg, fontweight="bold")
                hi = lo + block_q - 1 if q_len is None else min(lo + block_q, q_len) - 1
                lines = [f"q {_span(lo, hi)}"]
                if group is not None:
                    lines.append(f"heads {_span(h * group, h * group + group - 1)}")
                ax.text(x + cw / 2, y + ch * 0.32, "\n".join(lines), ha="center", va="center",
                        fontsize=9 if group is not None else 10, color=fg, linespacing=1.1)
        label = names[s] + ("" if q_len is None else f"\nq_len {q_len}")
        ax.text(x0 + seq_w / 2, num_kv_heads * ch + 0.12, label, ha="center", va="bottom", fontsize=12)
    for h in range(num_kv_heads):
        ax.text(-0.15, (num_kv_heads - 1 - h) * ch + ch / 2, f"KV head {h}", ha="right", va="center", fontsize=12)
    handles = [Patch(facecolor=owner_color(0), edgecolor="black", label="program (seq, KV head, q tile)")]
    if idle_any:
        handles.append(Patch(facecolor=IDLE, hatch="//", edgecolor="#777777", label="no queries: returns"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=len(handles), frameon=False)
    ax.set_xlim(-1.6, total_w + 0.1)
    ax.set_ylim(-0.1, num_kv_heads * ch + 0.95)
    ax.set_axis_off()
    n = num_seqs * num_kv_heads * num_q_tiles
    ax.set_title(title or f"grid = ({num_seqs}, {num_kv_heads}, {num_q_tiles}): {n} programs")
    return fig


# ---------------------------------------------------------------------------------------------
# One program's reads


def program_reads(
    block_table: Sequence[int], context_len: int, block_size: int, block_n: int, kv_end: int | None = None
) -> list[list[tuple[int, int, int]]]:
    """For each loop step, the ``(logical block, physical block, positions read)`` it touches.

    The kernel's walk: ``for start in range(0, kv_end, block_n)`` reads positions ``start ..
    min(start + block_n, kv_end) - 1``, each through ``block_table[pos // block_size]``.
    ``kv_end`` (default ``context_len``) is where the walk stops: a prefill query tile stops at
    its last query's position + 1.
    """
    kv_end = context_len if kv_end is None else kv_end
    if not 0 <= kv_end <= context_len:
        raise ValueError(f"kv_end ({kv_end}) must be in [0, context_len={context_len}]")
    if block_size < 1 or block_n < 1:
        raise ValueError("block_size and block_n must be >= 1")
    if -(-context_len // block_size) > len(block_table):
        raise ValueError(f"{context_len} tokens need {-(-context_len // block_size)} blocks, the table has "
                         f"{len(block_table)}")
    steps = []
    for start in range(0, kv_end, block_n):
        stop = min(start + block_n, kv_end)
        reads = []
        for logical in range(start // block_size, (stop - 1) // block_size + 1):
            lo, hi = max(start, logical * block_size), min(stop, (logical + 1) * block_size)
            reads.append((logical, int(block_table[logical]), hi - lo))
        steps.append(reads)
    return steps


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
    the physical block the table names.

    ``num_blocks`` is the pool size (default: just past the largest id used); ``kv_end`` as in
    :func:`program_reads`.

    Artists: one ``Rectangle`` per logical position (``gid`` ``"logical"``) and per pool slot
    (``"slot"``), one outline per read physical block (``"read"``), one ``ConnectionPatch`` per
    logical block read.
    """
    steps = program_reads(block_table, context_len, block_size, block_n, kv_end)
    kv_end = context_len if kv_end is None else kv_end
    n_logical = -(-context_len // block_size)
    used = [int(b) for b in block_table[:n_logical]]
    num_blocks = max(used, default=-1) + 1 if num_blocks is None else num_blocks
    if used and max(used) >= num_blocks:
        raise ValueError(f"block table names block {max(used)} but the pool has {num_blocks}")
    height = max(n_logical, num_blocks)
    fig, (ax_l, ax_p) = new_figure(max(9.0, 2 * 0.5 * block_size + 7.5), 0.42 * height + 2.4, ncols=2)

    def slot_box(ax, o, y, face, gid, label=None):
        ax.add_patch(Rectangle((o, y), 1, 1, facecolor=face, edgecolor="white", lw=1.2, gid=gid))
        if label is not None:
            ax.text(o + 0.5, y + 0.5, label, ha="center", va="center", fontsize=9 if block_size > 8 else 10,
                    color=_text_color(face))

    # Left: logical view of the sequence.
    for j in range(n_logical):
        y = height - 1 - j
        for o in range(block_size):
            pos = j * block_size + o
            if pos >= context_len:
                slot_box(ax_l, o, y, "white", "logical")
            elif pos >= kv_end:
                slot_box(ax_l, o, y, FREE, "logical", str(pos))
            else:
                slot_box(ax_l, o, y, step_color(pos // block_n), "logical", str(pos))
        ax_l.text(-0.2, y + 0.5, f"L{j}", ha="right", va="center", fontsize=12)
    ax_l.set_title(f"sequence, logical order\n({context_len} tokens, KV tiles of {block_n})", fontsize=13)

    # Right: the physical pool.
    read_by: dict[int, list[tuple[int, int]]] = {}  # physical block -> [(logical block, step)]
    slot_step: dict[tuple[int, int], tuple[int, int]] = {}  # (block, offset) -> (step, position)
    for step, reads in enumerate(steps):
        for logical, phys, _ in reads:
            if (logical, step) not in read_by.setdefault(phys, []):
                read_by[phys].append((logical, step))
    for pos in range(kv_end):
        phys = used[pos // block_size]
        slot_step.setdefault((phys, pos % block_size), (pos // block_n, pos))
    for b in range(num_blocks):
        y = height - 1 - b
        for o in range(block_size):
            if (b, o) in slot_step:
                step, pos = slot_step[(b, o)]
                slot_box(ax_p, o, y, step_color(step), "slot", str(pos))
            else:
                slot_box(ax_p, o, y, FREE, "slot")
        ax_p.text(-0.2, y + 0.5, str(b), ha="right", va="center", fontsize=12)
        if b in read_by:
            ax_p.add_patch(Rectangle((0, y), block_size, 1, fill=False, edgecolor="black", lw=2.2, zorder=3,
                                     gid="read"))
            logicals = sorted({lg for lg, _ in read_by[b]})
            stps = sorted({st for _, st in read_by[b]})
            label = ",".join(f"L{lg}" for lg in logicals) + "  step " + ",".join(map(str, stps))
            ax_p.text(block_size + 0.25, y + 0.5, label, ha="left", va="center", fontsize=11)
    ax_p.set_title(f"physical pool ({num_blocks} blocks x {block_size} slots)", fontsize=13)

    for ax in (ax_l, ax_p):
        ax.set_xlim(-0.1, block_size + 0.1)
        ax.set_ylim(-0.1, height + 0.1)
        ax.set_aspect("equal")
        ax.set_axis_off()
    ax_p.set_xlim(-0.1, block_size + 4.2)
    ax_p.text(-0.2, height + 0.15, "block", ha="right", va="bottom", fontsize=11)

    # Arrows: logical block -> physical block, coloured by the step that first reads it.
    for j in range(min(n_logical, -(-kv_end // block_size))):
        phys = used[j]
        step = (j * block_size) // block_n
        arrow = ConnectionPatch(xyA=(block_size + 0.1, height - 1 - j + 0.5), coordsA=ax_l.transData,
                                xyB=(-0.6, height - 1 - phys + 0.5), coordsB=ax_p.transData,
                                arrowstyle="-|>", mutation_scale=14, color=step_color(step), lw=1.6, alpha=0.9)
        fig.add_artist(arrow)

    spans = [_span(i * block_n, min((i + 1) * block_n, kv_end) - 1) for i in range(len(steps))]
    handles = [Patch(facecolor=step_color(i), label=f"step {i}: pos {span}") for i, span in enumerate(spans)]
    if kv_end < context_len:
        handles.append(Patch(facecolor=FREE, label="not read (after the tile's last query)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), frameon=False)
    fig.suptitle(title or f"one program: block table {used}, {len(steps)} loop steps", fontsize=15)
    return fig


# ---------------------------------------------------------------------------------------------
# Online softmax


def online_softmax_trace(scores: Sequence[float], block_n: int) -> dict[str, np.ndarray]:
    """Run the online softmax over ``scores`` in tiles of ``block_n`` (float64, natural exp).

    Returns the running max ``m`` and running sum ``l`` after each tile, the rescale factor
    ``alpha = exp(m_old - m_new)`` each tile applied, the probabilities ``exp(s - m) / l`` at the
    end (``p_online``) and ``np``'s direct softmax (``p_full``).
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if s.size == 0:
        raise ValueError("scores must not be empty")
    if block_n < 1:
        raise ValueError(f"block_n must be >= 1, got {block_n}")
    m, l_sum = -np.inf, 0.0
    ms, ls, alphas = [], [], []
    for start in range(0, s.size, block_n):
        tile = s[start : start + block_n]
        m_new = max(m, float(tile.max()))
        alpha = float(np.exp(m - m_new)) if np.isfinite(m) else 0.0
        l_sum = l_sum * alpha + float(np.exp(tile - m_new).sum())
        m = m_new
        ms.append(m)
        ls.append(l_sum)
        alphas.append(alpha)
    full = np.exp(s - s.max())
    return dict(m=np.array(ms), l=np.array(ls), alpha=np.array(alphas), p_online=np.exp(s - m) / l_sum,
                p_full=full / full.sum())


def draw_online_softmax(scores: Sequence[float], block_n: int, title: str | None = None) -> Figure:
    """Three stacked panels for one query row's ``scores`` walked in tiles of ``block_n`` keys:

    1. the scores (bars coloured by tile) and the running max ``m`` after each tile (a step line);
    2. the running sum ``l`` after each tile (``l = l * exp(m_old - m_new) + sum(exp(s - m_new))``),
       with the full sum ``sum(exp(s - max(s)))`` dashed: the last tile lands on it;
    3. the online probabilities ``exp(s - m) / l`` (bars) against the full softmax (dots).

    Artists: ``len(scores)`` bars (``gid`` ``"score"``) in panel 1 and ``len(scores)`` in panel 3,
    one bar per tile in panel 2.
    """
    tr = online_softmax_trace(scores, block_n)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n, n_tiles = s.size, len(tr["m"])
    x = np.arange(n)
    colors = [step_color(i // block_n) for i in range(n)]
    fig, (ax1, ax2, ax3) = new_figure(max(8.0, 0.3 * n + 3.0), 9.0, nrows=3)

    bars = ax1.bar(x, s, color=colors, edgecolor="white", width=0.85)
    for b in bars:
        b.set_gid("score")
    for t in range(n_tiles):
        lo, hi = t * block_n - 0.5, min((t + 1) * block_n, n) - 0.5
        ax1.hlines(tr["m"][t], lo, hi, color="black", lw=2.5, label="running max m" if t == 0 else None)
        ax1.text((lo + hi) / 2, tr["m"][t], f"m={tr['m'][t]:.2f}", ha="center", va="bottom", fontsize=10)
        if t:
            ax1.vlines(lo, tr["m"][t - 1], tr["m"][t], color="black", lw=2.5, linestyles=":")
            ax1.axvline(lo, color="#999999", lw=0.8, zorder=0)
    ax1.axhline(0, color="#555555", lw=0.8)
    ax1.set_ylim(top=float(tr["m"][-1]) + 0.15 * (float(tr["m"][-1]) - min(float(s.min()), 0.0)) + 0.3)
    ax1.set_ylabel("score")
    ax1.legend(loc="lower right", frameon=False)
    for ax in (ax1, ax3):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_title(title or f"online softmax over {n} keys in tiles of {block_n}")

    full_sum = float(np.exp(s - s.max()).sum())
    tiles = np.arange(n_tiles)
    ax2.bar(tiles, tr["l"], color=[step_color(t) for t in tiles], edgecolor="white", width=0.6)
    ax2.axhline(full_sum, color="black", ls="--", lw=1.5, label=f"full sum {full_sum:.3f}")
    for t in tiles:
        note = f"l={tr['l'][t]:.3f}"
        if t and tr["alpha"][t] < 1.0:
            note += f"\nold l x{tr['alpha'][t]:.2f}"  # the rescale a new max forced on the old sum
        ax2.text(t, tr["l"][t], note, ha="center", va="bottom", fontsize=10)
    ax2.set_xticks(tiles, [f"after tile {t}" for t in tiles], fontsize=11)
    ax2.set_ylim(0, 1.35 * max(full_sum, float(tr["l"].max())))
    ax2.set_ylabel("running sum l")
    ax2.legend(loc="upper left", frameon=False)

    ax3.bar(x, tr["p_online"], color=colors, edgecolor="white", width=0.85, label="online exp(s - m) / l")
    ax3.plot(x, tr["p_full"], "o", color="black", ms=5, label="full softmax")
    err = float(np.abs(tr["p_online"] - tr["p_full"]).max())
    ax3.set_xlabel("key position")
    ax3.set_ylabel("probability")
    ax3.legend(loc="upper left", frameon=False, fontsize=11)
    ax3.set_title(f"max |online - full| = {err:.1e}", fontsize=13)
    return fig
