"""Stage 6 pictures: shared prefixes in the block pool, copy-on-write, and the memory they save.

:func:`draw_shared_pool` draws each sequence's block table beside the pool (a shared block outlined
in vermillion, ``×n`` its ``ref_cnt``); :func:`draw_cow_steps` the same for several steps, an arrow
for every block copy-on-write copied; :func:`draw_savings` memory saved against the number of
requests sharing a prefix. A state is a ``StepSnapshot`` or ``(block_tables, num_tokens, ref_cnt,
cached)`` (:func:`as_state`); :func:`sharing_summary` and :func:`copies_between` give the numbers.
Tables and pool are :mod:`minipaged.viz.pool`'s; copy arrows have the gid ``"copy_arrow"``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch

from minipaged.utils import cdiv
from minipaged.viz.palette import MUTED, PAGED, SHARED, Ink, owner_inks
from minipaged.viz.pool import Labels, PoolState, pool_grid, pool_legend, table_rows, table_width
from minipaged.viz.snapshot import StepSnapshot
from minipaged.viz.style import EDGE, FONT_SIZE, MAX_HEIGHT, MAX_WIDTH, SMALL, new_figure, new_grid

if TYPE_CHECKING:
    from typing_extensions import TypeIs

# A state to draw: a snapshot, a PoolState, or a (block_tables, num_tokens, ref_cnt, cached) tuple
# whose trailing items may be left out (items of PoolState.from_tables' types).
State = PoolState | StepSnapshot | Sequence[Any]


class _Geometry(TypedDict):
    shown: int  # blocks of the pool drawn
    ncols: int  # columns of the pool
    rows: int
    pool_x: float  # where the pool starts
    label_w: float  # room for the row labels, left of x = 0
    width: float


def _is_snapshot(state: State) -> TypeIs[StepSnapshot]:
    """A ``StepSnapshot``, or any object like one (it has ``block_tables``)."""
    return hasattr(state, "block_tables")


def as_state(state: State, labels: Labels = None) -> PoolState:
    """A :class:`~minipaged.viz.pool.PoolState` with tables, from a ``StepSnapshot``-like object or a
    ``(block_tables, num_tokens, ref_cnt, cached)`` tuple (trailing items may be left out).
    ``labels`` names the sequences: key -> label, or labels in table order (default ``seq <key>``)."""
    if isinstance(state, PoolState):
        return state
    if _is_snapshot(state):
        return PoolState.from_snapshot(state, labels)
    tables, num_tokens, ref_cnt, cached = (tuple(state) + (None, None, None))[:4]
    return PoolState.from_tables(tables, num_tokens, ref_cnt, cached, labels)


def sharing_summary(state: State, block_size: int | None = None) -> dict[str, Any]:
    """Numbers behind the pictures, from the block tables alone (``state`` as in :func:`as_state`).

    ``blocks_in_use``: distinct blocks the tables hold; ``blocks_without_sharing``: what they would
    hold if no block were shared (the sum of the tables' lengths); ``blocks_saved`` = the
    difference; ``saved_fraction`` = saved / without; ``shared_blocks``: blocks in more than one
    table; ``max_ref_cnt``: the most tables holding one block; ``tokens_shared``: the shared
    blocks' slots (``block_size`` each) when ``block_size`` is given.
    """
    st = as_state(state)
    in_use, without = len(st.owners), sum(len(t) for t in st.tables.values())
    shared = sorted(b for b, o in st.owners.items() if len(o) > 1)
    out = dict(num_tables=len(st.tables), blocks_in_use=in_use, blocks_without_sharing=without, shared_blocks=shared)
    out |= dict(blocks_saved=without - in_use, saved_fraction=(without - in_use) / without if without else 0.0)
    out |= dict(max_ref_cnt=max(map(len, st.owners.values()), default=0))
    return out | ({"tokens_shared": len(shared) * block_size} if block_size is not None else {})


def copies_between(before: PoolState, after: PoolState) -> list[tuple[Hashable, int, int, int]]:
    """(sequence, logical block, old block, new block) for every block copy-on-write replaced: a table
    entry that changed from a block shared in ``before`` (``ref_cnt > 1``) to another block."""
    out: list[tuple[Hashable, int, int, int]] = []
    for name, new in after.tables.items():
        old = before.tables.get(name, [])
        out += [(name, j, a, b) for j, (a, b) in enumerate(zip(old, new)) if a != b and before.ref_cnt[a] > 1]
    return out


def _geometry(states: list[PoolState], ncols: int | None, max_blocks: int | None, show_tokens: bool) -> _Geometry:
    """Where the parts of a panel go, the same for every state, in data units where a block is 1 x 1:
    row labels left of x = 0 (``label_w``), tables from 0, the pool's ``ncols`` columns from ``pool_x``;
    ``rows`` rows. A pool bigger than ``max_blocks`` is ``shown`` up to its last block in use, plus a row."""
    n = max(len(st.ref_cnt) for st in states)
    used = max(b for st in states for b in [0, *st.owners] + [b for b, c in enumerate(st.cached) if c]) + 1
    shown = used if max_blocks is not None and n > max_blocks else n
    ncols = ncols or (min(shown, 10) if shown <= 20 else 12)
    shown = n if shown == n else min(n, (cdiv(shown, ncols) + 1) * ncols)
    tables = max(table_width(st.tables, st.shared_blocks()) for st in states)
    pool_x = max(tables, 2) + (2.8 if show_tokens else 0.3) + 1.0
    rows = max(max(len(st.tables) for st in states), cdiv(shown, ncols))
    label_w = 0.34 * max((len(str(name)) for st in states for name in st.tables), default=3) + 0.6
    return _Geometry(shown=shown, ncols=ncols, rows=rows, pool_x=pool_x, label_w=label_w, width=pool_x + ncols)


def _scaled(g: _Geometry, heights: float, extra_h: float) -> tuple[float, float, float]:
    """A figure's width and height, as big as fits MAX_WIDTH x MAX_HEIGHT (``extra_h`` inches for
    titles and legend), and a font size that grows with the blocks, never under SMALL + 1."""
    width = g["width"] + g["label_w"] + 0.5
    scale = min(0.62, (MAX_WIDTH - 0.5) / width, (MAX_HEIGHT - extra_h) / heights)
    return width * scale + 0.4, heights * scale + extra_h, max(SMALL + 1.0, min(FONT_SIZE + 2.0, scale * 72 * 0.36))


def _panel(
    ax: Axes,
    st: PoolState,
    g: _Geometry,
    block_size: int,
    inks: Mapping[Hashable, Ink],
    font: float,
    show_tokens: bool,
    top: float,
    head: bool,
) -> dict[int, tuple[float, float]]:
    """Tables (left) and pool (right) on ``ax``, up to y = ``top``; returns block id -> (x, y) of its pool cell."""
    counts = set(st.num_tokens.values())
    same = len(st.tables) > 1 and len(counts) == 1 and min(counts) >= 0  # say it once, not on every row
    notes = {k: f"{n} tokens" + " each" * same for i, (k, n) in enumerate(st.num_tokens.items()) if i == 0 or not same}
    notes = {k: v for k, v in notes.items() if show_tokens and st.num_tokens[k] >= 0}
    table_rows(ax, st, block_size, inks, top=g["rows"], notes=notes, size=font)
    shown, rows = g["shown"], g["rows"]
    text: dict[str, Any] = dict(va="center", fontsize=font - 1, color=MUTED)
    pool_top = rows - max(0, rows - cdiv(shown, g["ncols"])) / 2
    pool = PoolState(st.ref_cnt[:shown], st.cached[:shown], None, st.owners)
    fill = st.block_fill(block_size)
    xy = pool_grid(ax, pool, inks, g["ncols"], top=pool_top, x0=g["pool_x"], fill=fill, label=None, size=font)
    longest = max(map(len, st.tables.values()), default=0)
    if head:
        ax.text(g["pool_x"], rows + 0.3, "physical blocks (the pool)", ha="left", **{**text, "color": "black"})
    if head and table_width(st.tables, st.shared_blocks()) < longest:
        ax.text(0, rows + 0.3, "block tables (runs of shared blocks drawn as one cell)", ha="left", **text)
    elif head and longest:
        for j, label in enumerate(["logical", *map(str, range(longest))]):
            ax.text(j - 0.5 if j else -0.25, rows + 0.3, label, ha="center" if j else "right", **text)
    if shown < len(st.ref_cnt):
        more = f"+ {len(st.ref_cnt) - shown} more blocks, all free"
        ax.text(g["width"], pool_top - cdiv(shown, g["ncols"]) - 0.15, more, ha="right", **{**text, "va": "top"})
    bottom = -0.3 if shown == len(st.ref_cnt) else -0.8
    ax.set(xlim=(-g["label_w"], g["width"] + 0.2), ylim=(bottom, top), aspect="equal")
    ax.set_anchor("N")  # spare height goes below the drawing, never above the title
    ax.axis("off")
    return xy


def _legend(fig: Figure, states: list[PoolState], inks: Mapping[Hashable, Ink], font: float, cow: bool = False) -> None:
    # One entry per sequence while there are few; beyond that the row labels name them.
    entries = {h.get_label(): h for st in states for h in pool_legend(inks if len(inks) <= 12 else {}, st)}
    handles: list[Artist] = [*entries.values(), Patch(fc="white", ec=EDGE, label="empty slots (white part)")]
    handles += [Line2D([], [], color=SHARED, lw=2.5, marker=">", label="copy-on-write copy")] * cow
    fig.legend(handles=handles, frameon=False, loc="outside lower center", ncols=4, fontsize=font - 1)


def draw_shared_pool(
    state: State,
    labels: Labels = None,
    *,
    block_size: int = 16,
    hit_rate: float | None = None,
    title: str | None = None,
    ncols: int | None = None,
    max_blocks: int | None = 40,
    show_tokens: bool = True,
) -> Figure:
    """Each sequence's block table (left) beside the physical pool (right).

    ``state``: a ``StepSnapshot``, ``PoolState`` or ``(block_tables, num_tokens, ref_cnt,
    cached)``; ``labels`` names the sequences (key -> label, or a list in table order). A block's
    coloured part is the share of its ``block_size`` slots that hold tokens. Blocks used by more
    than one sequence have a thick vermillion outline, in the tables and in the pool, where ``×n``
    is their ``ref_cnt``. Free blocks are grey (pale blue and dotted: still cached, a later request
    can revive them). ``hit_rate`` (0..1, e.g. from ``kv_stats()``) is added to the summary line.
    Pools bigger than ``max_blocks`` are drawn up to the last block in use.
    """
    st = as_state(state, labels)
    g, inks = _geometry([st], ncols, max_blocks, show_tokens), owner_inks(st.tables)
    width, height, font = _scaled(g, g["rows"] + 1.1, 1.7)
    fig, ax = new_figure(width, height)
    _panel(ax, st, g, block_size, inks, font, show_tokens, g["rows"] + 0.7, head=True)
    s, hits = sharing_summary(st), f" · prefix hit rate {hit_rate:.0%}" if hit_rate is not None else ""
    n, shared = s["num_tables"], len(s["shared_blocks"])
    summary = f"{n} sequence{'s' * (n != 1)} · {shared} shared block{'s' * (shared != 1)} · {s['blocks_in_use']} "
    summary += f"blocks in use instead of {s['blocks_without_sharing']} ({s['saved_fraction']:.0%} saved){hits}"
    ax.set_title(f"{title}\n{summary}" if title else summary, loc="left", fontsize=font + 1)
    _legend(fig, [st], inks, font)
    return fig


def draw_cow_steps(
    frames: Sequence[State],
    labels: Labels = None,
    *,
    block_size: int = 16,
    titles: Sequence[str] | None = None,
    ncols: int | None = None,
) -> Figure:
    """Copy-on-write, one panel per state (e.g. the snapshots of consecutive steps of an ``n > 1`` request).

    Each panel is :func:`draw_shared_pool`'s picture; a vermillion arrow in the pool goes from a
    shared block to the copy a sequence got before writing to it (found by comparing the panel
    with the one before, :func:`copies_between`). ``titles``: one per frame; by default the copies.
    """
    if not frames:
        raise ValueError("no frames to draw")
    states = [as_state(f, labels) for f in frames]
    if titles is not None and len(titles) != len(states):
        raise ValueError(f"{len(titles)} titles for {len(states)} frames")
    inks, g = owner_inks(n for s in states for n in s.tables), _geometry(states, ncols, None, True)
    copies = [copies_between(states[k - 1], st) if k else [] for k, st in enumerate(states)]
    # Room above each panel's content: column headers (first panel), copy arrows (panels with copies).
    tops = [g["rows"] + (0.7 if k == 0 else 0.15) + (1.0 if copies[k] else 0) for k in range(len(states))]
    width, height, font = _scaled(g, sum(tops) + 0.3 * len(states), 1.0 + 0.55 * len(states))
    ratios = dict(height_ratios=[t + 0.3 for t in tops])
    fig, axes = new_grid(width, height, nrows=len(states), gridspec_kw=ratios)
    for k, (ax, st) in enumerate(zip([row[0] for row in axes], states)):
        xy = _panel(ax, st, g, block_size, inks, font, True, tops[k], head=k == 0)
        for _, _, a, b in copies[k]:
            (xa, ya), (xb, yb) = xy[a], xy[b]
            rad = min(0.45, 1.8 / max(abs(xb - xa), 1)) if abs(ya - yb) < 1e-9 else 0.2  # arcs at most ~0.9 high
            arc = f"arc3,rad={-rad if xb > xa else rad}"
            ends = (xa + 0.5, ya + 0.95), (xb + 0.5, yb + 0.95)
            arrow = FancyArrowPatch(
                *ends, arrowstyle="-|>", connectionstyle=arc, shrinkA=2, shrinkB=2, gid="copy_arrow"
            )
            ax.add_patch(arrow).set(mutation_scale=22, color=SHARED, lw=2.5)
        moved = ", ".join(f"{n}: {a} → {b}" for n, _, a, b in copies[k])
        head = titles[k] if titles is not None else f"frame {k}" + (f" — copy-on-write: {moved}" if moved else "")
        ax.set_title(head, loc="left", fontsize=font + 1)
    _legend(fig, states, inks, font, cow=len(states) > 1)
    return fig


def draw_savings(
    ns: Sequence[int],
    saved_fraction: Sequence[float],
    hit_rate: Sequence[float] | None = None,
    *,
    limit: float | None = None,
    title: str | None = None,
    xlabel: str = "N, requests sharing the prefix",
) -> Figure:
    """Memory saved (and, optionally, the prefix hit rate) against the number of requests sharing a prefix.

    ``saved_fraction`` / ``hit_rate``: fractions 0..1, one per ``ns`` entry (drawn as percent).
    ``limit``: the fraction that sharing approaches as N grows (the prefix's share of a request's
    blocks), drawn as a dotted line. Saved memory takes the paged pool's colour, hits the shared
    blocks'; each line's last value is written at its end.
    """
    if len(ns) != len(saved_fraction) or (hit_rate is not None and len(hit_rate) != len(ns)):
        raise ValueError("ns, saved_fraction and hit_rate must have the same length")
    fig, ax = new_figure(10, 5.5)
    ns, big = list(ns), FONT_SIZE + 2
    lines = [("KV memory saved", "-o", PAGED, "saved", saved_fraction)]
    if hit_rate is not None:
        lines.append(("prefix hit rate (prompt tokens)", "--s", SHARED, "hit_rate", hit_rate))
    ends = [100 * values[-1] for *_, values in lines]
    apart = 9 if abs(ends[0] - ends[-1]) < 7 else 0  # end labels pushed apart when close
    apart = apart if ends[0] >= ends[-1] else -apart
    for (label, fmt, color, gid, values), offset in zip(lines, (apart, -apart)):
        ys = [100 * v for v in values]
        ax.plot(ns, ys, fmt, color=color, lw=3, ms=9, label=label, gid=gid)
        at, beside = (ns[-1], ys[-1]), (10, offset)
        ax.annotate(
            f"{ys[-1]:.0f}%",
            at,
            xytext=beside,
            textcoords="offset points",
            va="center",
            fontsize=big,
            weight="bold",
            color=color,
        )
    if limit is not None:
        label = f"memory saved as N → ∞ ({limit:.0%})"
        ax.axhline(100 * limit, color="#555555", ls=":", lw=2.5, label=label, gid="limit")
    ax.set_xlabel(xlabel, fontsize=big)
    ax.set_ylabel("percent", fontsize=big)
    ax.set(ylim=(0, 105), xlim=(min(ns) - 0.5, max(ns) + 1.5), xticks=ns if len(ns) <= 16 else ns[:: cdiv(len(ns), 16)])
    ax.tick_params(labelsize=FONT_SIZE + 1)
    ax.grid(True, color="#DDDDDD", lw=1)
    ax.set_axisbelow(True)
    ax.legend(loc="lower right", fontsize=FONT_SIZE, frameon=True, framealpha=0.95)
    title = title or "Sharing one prefix: the more requests, the more memory saved"
    ax.set_title(title, loc="left", fontsize=FONT_SIZE + 3)
    return fig
