"""Stage 6 pictures: shared prefixes in the block pool, copy-on-write, and the memory they save.

Pure render functions (state -> ``matplotlib.figure.Figure``, never shown):

- :func:`draw_shared_pool`: each sequence's block table beside the pool, shared blocks hatched
  with a thick outline and their ``ref_cnt`` written in them;
- :func:`draw_cow_steps`: the same picture for several steps, one panel each, with an arrow
  for every block that copy-on-write copied since the previous panel;
- :func:`draw_savings`: memory saved (and prefix hit rate) against the number of requests
  sharing a prefix.

A state is a :class:`~minipaged.viz.prefix_state.PrefixState`; a ``StepSnapshot`` (what
``LLM.step()`` returns) or a tuple ``(block_tables, num_tokens, ref_cnt, cached)`` is turned into
one by :func:`~minipaged.viz.prefix_state.as_state`. Patches and texts carry a ``gid`` so tests
can count them: ``"table_cell"`` (one table entry), ``"table_run"`` (a run of shared entries drawn
as one cell in long tables), ``"pool_block"``, ``"shared_outline"`` (a shared block, in a table or
the pool), ``"ref_cnt"`` (the ``×n`` text), ``"copy_arrow"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib import patheffects
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from minipaged.utils import cdiv
from minipaged.viz.palette import (
    CACHED,
    CACHED_HATCH,
    FREE,
    IN_USE,
    MUTED,
    PAGED,
    SHARED,
    SHARED_FILL,
    SHARED_HATCH,
    Ink,
    owner_inks,
)
from minipaged.viz.prefix_state import Labels, PrefixState, as_state, copies_between, sharing_summary
from minipaged.viz.style import FONT_SIZE, MAX_HEIGHT, MAX_WIDTH, SMALL, new_figure

__all__ = [
    "PrefixState",
    "as_state",
    "copies_between",
    "draw_cow_steps",
    "draw_savings",
    "draw_shared_pool",
    "sharing_summary",
]

INSET = 0.07  # gap around each block, in block widths
COMPRESS_AT = 12  # tables longer than this collapse runs of shared blocks
RUN_MIN, RUN_W = 3, 3.0
LEGEND_MAX = 12
HALO = [patheffects.withStroke(linewidth=3.5, foreground="white")]


def _segments(table: list[int], shared: set[int], compress: bool) -> list[tuple[float, float, int, list[int]]]:
    """(x, width, first logical index, block ids) per drawn cell of one table, left to right."""
    out, x, j = [], 0.0, 0
    while j < len(table):
        k = j
        while compress and k < len(table) and table[k] in shared:
            k += 1
        if k - j >= RUN_MIN:
            out.append((x, RUN_W, j, table[j:k]))
            x, j = x + RUN_W, k
        else:
            out.append((x, 1.0, j, [table[j]]))
            x, j = x + 1, j + 1
    return out


class _Layout:
    """Where things go, in data units where one block is 1 x 1."""

    def __init__(self, st: PrefixState, ncols: int | None, max_blocks: int | None, show_tokens: bool) -> None:
        self.num_blocks = len(st.ref_cnt)
        highest = max([max(st.users, default=-1)] + [i for i, c in enumerate(st.cached) if c])
        shown = self.num_blocks
        if max_blocks is not None and self.num_blocks > max_blocks:
            shown = max(highest + 1, 1)  # big pools: up to the last block in use (+ a row below)
        self.ncols = ncols or (min(shown, 10) if shown <= 20 else 12)
        if shown < self.num_blocks:
            shown = min(self.num_blocks, (cdiv(shown, self.ncols) + 1) * self.ncols)
        self.shown = shown
        self.pool_rows = cdiv(shown, self.ncols)
        self.table_len = max((len(t) for t in st.tables.values()), default=0)
        # Long tables: a run of RUN_MIN or more consecutive shared blocks is drawn as one wide cell.
        self.compressed = self.table_len > COMPRESS_AT
        shared = st.shared_blocks()
        self.segments = {name: _segments(t, shared, self.compressed) for name, t in st.tables.items()}
        self.cells_w = max((seg[-1][0] + seg[-1][1] for seg in self.segments.values() if seg), default=0)
        self.label_w = 0.34 * max((len(n) for n in st.tables), default=3) + 0.6
        self.tokens_w = 2.8 if show_tokens else 0.3
        self.table_w = max(self.cells_w, 2) + self.tokens_w
        self.pool_x = self.table_w + 1.0
        self.rows = max(len(st.tables), self.pool_rows)
        self.width = self.pool_x + self.ncols
        self.height = self.rows + 0.7  # + column headers


def _scale(width: float, height: float, extra_h: float) -> tuple[float, float]:
    """(inches per block, font size): as big as fits MAX_WIDTH x MAX_HEIGHT, ids never under SMALL."""
    scale = min(0.62, (MAX_WIDTH - 0.5) / width, (MAX_HEIGHT - extra_h) / height)
    return scale, max(SMALL + 1.0, min(FONT_SIZE + 2.0, scale * 72 * 0.36))


def _block(
    ax,
    x: float,
    y: float,
    fill: float,
    ink: Ink,
    shared: bool,
    free: bool,
    cached: bool,
    gid: str,
    lw_shared: float = 4.0,
    width: float = 1.0,
) -> None:
    """One block at (x, y): filled left to right by ``fill``, shared = hatched with a thick outline."""
    w, h = width - 2 * INSET, 1 - 2 * INSET
    x0, y0 = x + INSET, y + INSET
    if free:
        ax.add_patch(
            Rectangle(
                (x0, y0),
                w,
                h,
                facecolor=CACHED if cached else FREE,
                edgecolor="#999999",
                lw=1,
                hatch=CACHED_HATCH if cached else None,
                gid=gid,
            )
        )
        return
    ax.add_patch(Rectangle((x0, y0), w, h, facecolor="white", edgecolor="none", gid=gid))
    if fill > 0:
        ax.add_patch(
            Rectangle(
                (x0, y0),
                w * fill,
                h,
                facecolor=SHARED_FILL if shared else ink.color,
                lw=0,
                edgecolor=SHARED if shared else "#333333",
                hatch=SHARED_HATCH if shared else ink.hatch,
            )
        )
    if shared:
        ax.add_patch(Rectangle((x0, y0), w, h, fill=False, edgecolor=SHARED, lw=lw_shared, gid="shared_outline"))
    else:
        ax.add_patch(Rectangle((x0, y0), w, h, fill=False, edgecolor="#333333", lw=1.3))


def _id_text(ax, x: float, y: float, text: str, size: float, **kw) -> None:
    """A block id in bold black with a white halo: readable on every fill, and the fill stays visible."""
    ax.text(
        x, y, text, ha="center", va="center", fontsize=size, color="black", fontweight="bold", path_effects=HALO, **kw
    )


def _draw_state(
    ax,
    st: PrefixState,
    lay: _Layout,
    block_size: int,
    inks: Mapping[str, Ink],
    font: float,
    show_tokens: bool,
    headers: bool = True,
) -> dict[int, tuple[float, float]]:
    """Tables (left) and pool (right) on ``ax``; returns block id -> (x, y) of its pool cell."""
    fill = st.block_fill(block_size)
    shared = st.shared_blocks()
    top = lay.rows  # rows go downwards from here
    counts = {n for n in st.num_tokens.values()}
    same_count = len(st.tables) > 1 and len(counts) == 1 and min(counts) >= 0  # say it once, not on every row

    # Block tables, one row per sequence.
    for i, (name, table) in enumerate(st.tables.items()):
        y = top - 1 - i
        ax.text(-0.25, y + 0.5, name, ha="right", va="center", fontsize=font + 1, fontweight="bold")
        for x, w, j, ids in lay.segments[name]:
            if len(ids) > 1:  # a run of shared blocks, drawn as one
                _block(ax, x, y, 1.0, inks[name], True, False, False, "table_run", lw_shared=3.5, width=w)
                consecutive = ids == list(range(ids[0], ids[0] + len(ids)))
                _id_text(ax, x + w / 2, y + 0.5, f"{ids[0]}–{ids[-1]}" if consecutive else f"{len(ids)} blocks", font)
                continue
            b = ids[0]
            _block(
                ax,
                x,
                y,
                st.fill(name, j, block_size),
                inks[name],
                b in shared,
                False,
                False,
                "table_cell",
                lw_shared=3.5,
            )
            _id_text(ax, x + 0.5, y + 0.5, str(b), font if b < 100 else max(SMALL, font - 3))
        n = st.num_tokens[name]
        if show_tokens and n >= 0 and (i == 0 or not same_count):
            end = lay.segments[name][-1][0] + lay.segments[name][-1][1] if table else 0
            ax.text(
                end + 0.2,
                y + 0.5,
                f"{n} tokens" + (" each" if same_count else ""),
                ha="left",
                va="center",
                fontsize=font - 1,
                color=MUTED,
            )
    if headers and lay.table_len:
        if lay.compressed:
            ax.text(
                0,
                top + 0.3,
                "block tables (runs of shared blocks drawn as one cell)",
                ha="left",
                va="center",
                fontsize=font - 1,
                color=MUTED,
            )
        else:
            ax.text(-0.25, top + 0.3, "logical", ha="right", va="center", fontsize=font - 1, color=MUTED)
            for j in range(lay.table_len):
                ax.text(j + 0.5, top + 0.3, str(j), ha="center", va="center", fontsize=font - 1, color=MUTED)

    # The pool, row-major, first block top left.
    xy = {}
    pool_top = top - (lay.rows - lay.pool_rows) / 2 if lay.pool_rows < lay.rows else top
    for b in range(lay.shown):
        row, col = divmod(b, lay.ncols)
        x, y = lay.pool_x + col, pool_top - 1 - row
        xy[b] = (x, y)
        rc, owner = st.ref_cnt[b], st.owner(b)
        ink = inks[owner] if owner is not None else Ink(IN_USE)  # IN_USE: a sequence not drawn holds it
        _block(ax, x, y, fill.get(b, 1.0), ink, b in shared, rc == 0, st.cached[b], "pool_block")
        if rc == 0:
            ax.text(x + 0.5, y + 0.5, str(b), ha="center", va="center", fontsize=font - 1, color=MUTED)
        elif b in shared:
            _id_text(ax, x + 0.5, y + 0.7, str(b), font - 1)
            ax.text(
                x + 0.5,
                y + 0.3,
                f"×{rc}",
                ha="center",
                va="center",
                fontsize=font,
                fontweight="bold",
                color="black",
                gid="ref_cnt",
                bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor=SHARED, lw=1.5),
            )
        else:
            _id_text(ax, x + 0.5, y + 0.5, str(b), font if b < 100 else max(SMALL, font - 3))
    if headers:
        ax.text(
            lay.pool_x,
            top + 0.3,
            "physical blocks (the pool)",
            ha="left",
            va="center",
            fontsize=font,
            fontweight="bold",
        )
    if lay.shown < lay.num_blocks:
        ax.text(
            lay.pool_x + lay.ncols,
            pool_top - lay.pool_rows - 0.15,
            f"+ {lay.num_blocks - lay.shown} more blocks, all free",
            ha="right",
            va="top",
            fontsize=font - 1,
            color=MUTED,
        )
    return xy


def _legend(
    fig: Figure, st: PrefixState, inks: Mapping[str, Ink], any_shared: bool, font: float, cow: bool = False
) -> None:
    names = list(st.tables)
    # One entry per sequence while there are few; beyond that the row labels name them.
    handles = [
        Patch(facecolor=inks[n].color, hatch=inks[n].hatch, edgecolor="#333333", label=n)
        for n in names
        if len(names) <= LEGEND_MAX
    ]
    if any_shared:
        handles.append(
            Patch(facecolor=SHARED_FILL, edgecolor=SHARED, hatch=SHARED_HATCH, lw=3, label="shared: ×n = ref_cnt")
        )
    if any(r == 0 and not c for c, r in zip(st.cached, st.ref_cnt)):
        handles.append(Patch(facecolor=FREE, edgecolor="#999999", label="free"))
    if any(c and r == 0 for c, r in zip(st.cached, st.ref_cnt)):
        handles.append(Patch(facecolor=CACHED, edgecolor="#999999", hatch=CACHED_HATCH, label="free, still cached"))
    handles.append(Patch(facecolor="white", edgecolor="#333333", label="empty slots (white part)"))
    if cow:
        handles.append(Line2D([], [], color=SHARED, lw=2.5, marker=">", label="copy-on-write copy"))
    fig.legend(
        handles=handles,
        frameon=False,
        loc="outside lower center",
        ncols=min(4, len(names) + 3),
        fontsize=max(SMALL, font - 1),
    )


def _summary_line(st: PrefixState, hit_rate: float | None) -> str:
    s = sharing_summary(st)

    def plural(n: int, word: str) -> str:
        return f"{n} {word}" if n == 1 else f"{n} {word}s"

    parts = [
        plural(s["num_tables"], "sequence"),
        plural(len(s["shared_blocks"]), "shared block"),
        f"{s['blocks_in_use']} blocks in use instead of {s['blocks_without_sharing']}"
        f" ({s['saved_fraction']:.0%} saved)",
    ]
    if hit_rate is not None:
        parts.append(f"prefix hit rate {hit_rate:.0%}")
    return " · ".join(parts)


def draw_shared_pool(
    state,
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

    ``state``: a ``PrefixState``, ``StepSnapshot`` or ``(block_tables, num_tokens, ref_cnt,
    cached)``; ``labels`` names the sequences (key -> label, or a list in table order). A block's
    coloured part is the share of its ``block_size`` slots that hold tokens. Blocks used by more
    than one sequence are hatched with a thick vermillion outline, in the tables and in the pool,
    where ``×n`` is their ``ref_cnt``. Free blocks are grey (pale blue and dotted: still cached, a
    later request can revive them). ``hit_rate`` (0..1, e.g. from ``kv_stats()``) is added to the
    summary line. Pools bigger than ``max_blocks`` are drawn up to the last block in use.
    """
    st = as_state(state, labels)
    lay = _Layout(st, ncols, max_blocks, show_tokens)
    inks = owner_inks(st.tables)
    width = lay.width + lay.label_w + 0.5
    scale, font = _scale(width, lay.height + 0.4, 1.9)
    fig, ax = new_figure(width * scale + 0.4, (lay.height + 0.4) * scale + 1.7)
    _draw_state(ax, st, lay, block_size, inks, font, show_tokens)
    ax.set_xlim(-lay.label_w, lay.width + 0.2)
    ax.set_ylim(-0.3 if lay.shown == lay.num_blocks else -0.8, lay.height)
    ax.set_aspect("equal")
    ax.set_anchor("N")  # spare height goes below the drawing, never above the title
    ax.axis("off")
    summary = _summary_line(st, hit_rate)
    ax.set_title(f"{title}\n{summary}" if title else summary, loc="left", fontsize=font + 1)
    _legend(fig, st, inks, bool(st.shared_blocks()), font)
    return fig


def draw_cow_steps(
    frames: Sequence,
    labels: Labels = None,
    *,
    block_size: int = 16,
    titles: Sequence[str] | None = None,
    ncols: int | None = None,
) -> Figure:
    """Copy-on-write, one panel per state (e.g. the snapshots of consecutive steps of an ``n > 1`` request).

    Each panel is :func:`draw_shared_pool`'s picture; a vermillion arrow in the pool goes from a
    shared block to the copy a sequence got before writing to it (found by comparing the panel
    with the one before, :func:`~minipaged.viz.prefix_state.copies_between`). ``titles``: one per
    frame; by default the copies are listed.
    """
    if not frames:
        raise ValueError("no frames to draw")
    states = [as_state(f, labels) for f in frames]
    if titles is not None and len(titles) != len(states):
        raise ValueError(f"{len(titles)} titles for {len(states)} frames")
    names = list(dict.fromkeys(n for s in states for n in s.tables))
    inks = owner_inks(names)
    lays = [_Layout(s, ncols, None, True) for s in states]
    width = max(lay.width for lay in lays)
    label_w = max(lay.label_w for lay in lays)
    for lay in lays:  # same geometry in every panel
        lay.label_w, lay.width = label_w, width
    copies = [copies_between(states[k - 1], st) if k else [] for k, st in enumerate(states)]
    # Room above each panel's content: column headers (first panel), copy arrows (panels with copies).
    tops = [lay.rows + (0.7 if k == 0 else 0.15) + (1.0 if copies[k] else 0) for k, lay in enumerate(lays)]
    heights = [t + 0.3 for t in tops]
    scale, font = _scale(width + label_w + 0.5, sum(heights), 1.2 + 0.55 * len(states))
    fig, axes = new_figure(
        (width + label_w + 0.5) * scale + 0.4,
        sum(heights) * scale + 1.0 + 0.55 * len(states),
        nrows=len(states),
        squeeze=False,
        gridspec_kw=dict(height_ratios=heights),
    )
    for k, (ax, st, lay) in enumerate(zip(axes[:, 0], states, lays)):
        xy = _draw_state(ax, st, lay, block_size, inks, font, True, headers=k == 0)
        for _, _, a, b in copies[k]:
            (xa, ya), (xb, yb) = xy[a], xy[b]
            rad = min(0.45, 1.8 / max(abs(xb - xa), 1)) if abs(ya - yb) < 1e-9 else 0.2  # arcs at most ~0.9 high
            ax.add_patch(
                FancyArrowPatch(
                    (xa + 0.5, ya + 1 - INSET),
                    (xb + 0.5, yb + 1 - INSET),
                    arrowstyle="-|>",
                    mutation_scale=22,
                    color=SHARED,
                    lw=2.5,
                    gid="copy_arrow",
                    shrinkA=2,
                    shrinkB=2,
                    connectionstyle=f"arc3,rad={-rad if xb > xa else rad}",
                )
            )
        if titles is not None:
            head = titles[k]
        else:
            moved = ", ".join(f"{n}: {a} → {b}" for n, _, a, b in copies[k])
            head = f"frame {k}" + (f" — copy-on-write: {moved}" if moved else "")
        ax.set_title(head, loc="left", fontsize=font + 1)
        ax.set_xlim(-label_w, width + 0.2)
        ax.set_ylim(-0.3, tops[k])
        ax.set_aspect("equal")
        ax.set_anchor("N")
        ax.axis("off")
    all_st = PrefixState(
        {n: [] for n in names}, {}, [r for s in states for r in s.ref_cnt], [c for s in states for c in s.cached]
    )
    _legend(fig, all_st, inks, True, font, cow=len(states) > 1)
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
    blocks), drawn as a dotted line.
    """
    if len(ns) != len(saved_fraction) or (hit_rate is not None and len(hit_rate) != len(ns)):
        raise ValueError("ns, saved_fraction and hit_rate must have the same length")
    fig, ax = new_figure(10, 5.5)
    ns = list(ns)
    saved = [100 * f for f in saved_fraction]
    hits = [100 * h for h in hit_rate] if hit_rate is not None else None
    hit_color = SHARED  # saved memory is the paged pool's colour; hits are the shared blocks'
    ax.plot(ns, saved, "-o", color=PAGED, lw=3, ms=9, label="KV memory saved", gid="saved")
    # End-of-line labels, pushed apart when the two lines end close together.
    apart = 0 if hits is None or abs(hits[-1] - saved[-1]) >= 7 else (9 if saved[-1] >= hits[-1] else -9)
    ax.annotate(
        f"{saved[-1]:.0f}%",
        (ns[-1], saved[-1]),
        xytext=(10, apart),
        textcoords="offset points",
        va="center",
        fontsize=FONT_SIZE + 2,
        fontweight="bold",
        color=PAGED,
    )
    if hits is not None:
        ax.plot(ns, hits, "--s", color=hit_color, lw=3, ms=9, label="prefix hit rate (prompt tokens)", gid="hit_rate")
        ax.annotate(
            f"{hits[-1]:.0f}%",
            (ns[-1], hits[-1]),
            xytext=(10, -apart),
            textcoords="offset points",
            va="center",
            fontsize=FONT_SIZE + 2,
            fontweight="bold",
            color=hit_color,
        )
    if limit is not None:
        ax.axhline(
            100 * limit, color="#555555", ls=":", lw=2.5, label=f"memory saved as N → ∞ ({limit:.0%})", gid="limit"
        )
    ax.set_xlabel(xlabel, fontsize=FONT_SIZE + 2)
    ax.set_ylabel("percent", fontsize=FONT_SIZE + 2)
    ax.set_ylim(0, 105)
    ax.set_xlim(min(ns) - 0.5, max(ns) + 1.5)
    ax.set_xticks(ns if len(ns) <= 16 else ns[:: cdiv(len(ns), 16)])
    ax.tick_params(labelsize=FONT_SIZE + 1)
    ax.grid(True, color="#DDDDDD", lw=1)
    ax.set_axisbelow(True)
    ax.legend(loc="lower right", fontsize=FONT_SIZE, frameon=True, framealpha=0.95)
    ax.set_title(
        title or "Sharing one prefix: the more requests, the more memory saved", loc="left", fontsize=FONT_SIZE + 3
    )
    return fig
