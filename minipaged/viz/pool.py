"""Pictures of paged KV memory: the block pool (stage 1) and block tables (stage 2), and the pieces
every picture of a pool is made of, so that a block looks the same in all of them.

:class:`PoolState` is a pool in plain form; :func:`pool_grid` draws its blocks as a grid, coloured
by owner (shared: outlined in vermillion, ``×ref_cnt``; free: grey; free but still holding a cached
prefix: pale blue, dotted); :func:`table_rows` draws one row of blocks per sequence, the coloured
part of a block holding tokens; :func:`pool_legend` says what those looks mean. :func:`draw_pool`
and :func:`draw_block_tables` (logical blocks -> block table -> physical blocks) are the stage 1-2
pictures. Patches carry a ``gid`` (``"block"``, ``"table_cell"``, ``"logical"``, ``"physical"``...).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch

from minipaged.kv.block_pool import BlockPool
from minipaged.kv.block_table import BlockTable
from minipaged.viz.palette import CACHED, CACHED_HATCH, FREE, IN_USE, MUTED, SHARED, Ink, natural_order, owner_inks
from minipaged.viz.pool_state import (  # noqa: F401  (re-exported: the pictures' names)
    K,
    Labels,
    OwnerLabel,
    PoolState,
    Table,
    _fill,
    owner_lists,
    owners_from_tables,
)
from minipaged.viz.style import EDGE, FONT_SIZE, HALO, SMALL, box, new_figure

LEGEND_MAX = 16  # owners listed in a legend; more are summed up in one line
COMPRESS_AT, RUN_MIN, RUN_W = 12, 3, 3.0  # tables longer than 12 draw a run of >= 3 shared blocks as one cell


def pool_grid(
    ax: Axes,
    pool: PoolState,
    inks: Mapping[Hashable, Ink],
    ncols: int,
    *,
    top: float = 0.0,
    x0: float = 0.0,
    fill: Mapping[int, float] | None = None,
    tags: Mapping[int, str] | None = None,
    label: OwnerLabel | None = str,
    size: float = SMALL + 1,
) -> dict[int, tuple[float, float]]:
    """Every block of ``pool`` as a unit cell, block 0 at (``x0``, ``top - 1``), rows going down.

    A cell has its block id in the corner; in the middle, its ``tags`` entry (e.g. ``"evicted"``),
    or its owners' names (``label`` turns an owner into text; None: ``×ref_cnt`` of a shared block);
    in the other corner ``×ref_cnt`` when shared, or ``qN``, its place in the free queue, when free.
    Its colour is its first owner's (``inks``), its filled share ``fill[b]`` (default: full).
    Returns block -> (x, y) of its cell.
    """
    queue = {b: i for i, b in enumerate(pool.free_order or [])}
    xy: dict[int, tuple[float, float]] = {}
    for b, rc in enumerate(pool.ref_cnt):
        x, y = xy[b] = x0 + b % ncols, top - 1 - b // ncols
        who = pool.owners.get(b, []) if rc else []
        ink = inks[who[0]] if who else Ink(IN_USE) if rc else Ink(FREE)
        ink = Ink(CACHED, CACHED_HATCH) if pool.is_cached(b) else ink
        ec, lw = (SHARED, 3.5) if rc > 1 else (EDGE, 1.0)
        box(ax, (x + 0.05, y + 0.05, 0.9, 0.9), ink, (fill or {}).get(b, 1.0), gid="block", ec=ec, lw=lw)
        shared = f"×{rc}" if rc > 1 else ""
        names = ",".join(map(label, who)) if label else shared
        middle = (tags or {}).get(b) or (names[:5] + "…" if len(names) > 6 else names)
        corner = shared if middle != shared else f"q{queue[b]}" if rc == 0 and b in queue else ""
        text: dict[str, Any] = dict(path_effects=HALO, color="black" if rc else MUTED, weight="bold")
        ax.text(x + 0.5, y + 0.45, middle, ha="center", va="center", fontsize=size + 2 * (len(middle) <= 3), **text)
        ax.text(x + 0.1, y + 0.88, str(b), ha="left", va="top", fontsize=size - 1, **{**text, "weight": "normal"})
        ax.text(x + 0.9, y + 0.1, corner, ha="right", va="bottom", fontsize=size - 1, **text)
    return xy


def _segments(table: Sequence[int], shared: set[int], compress: bool) -> list[tuple[float, float, int, list[int]]]:
    """(x, width, first logical index, block ids) per cell of a table; a run of shared blocks may be one wide cell."""
    out: list[tuple[float, float, int, list[int]]] = []
    x, j = 0.0, 0
    while j < len(table):
        k = j
        while compress and k < len(table) and table[k] in shared:
            k += 1
        k = k if k - j >= RUN_MIN else j + 1
        out.append((x, RUN_W if k - j > 1 else 1.0, j, list(table[j:k])))
        x, j = x + out[-1][1], k
    return out


def table_width(tables: Mapping[K, Sequence[int]], shared: set[int]) -> float:
    """How wide :func:`table_rows` draws the longest of ``tables`` (in cells)."""
    compress = max(map(len, tables.values()), default=0) > COMPRESS_AT
    return max((sum(s[1] for s in _segments(t, shared, compress)) for t in tables.values()), default=0.0)


def table_rows(
    ax: Axes,
    pool: PoolState,
    block_size: int,
    inks: Mapping[Hashable, Ink],
    *,
    top: float = 0.0,
    label: OwnerLabel = str,
    notes: Mapping[Hashable, str] | None = None,
    size: float = SMALL + 1,
) -> None:
    """One row of unit cells per table of ``pool``, going down from ``top``: the owner's name, then its blocks.

    A cell shows a physical block id; its coloured part holds tokens. A shared block is outlined
    in vermillion. When a table is longer than ``COMPRESS_AT``, each run of ``RUN_MIN`` or more
    shared blocks is one wide cell (``"table_run"``). ``notes[owner]`` is written after the row.
    """
    shared = pool.shared_blocks()
    compress = max(map(len, pool.tables.values()), default=0) > COMPRESS_AT
    for i, (owner, table) in enumerate(pool.tables.items()):
        y, end = top - 1 - i, 0.0
        ax.text(-0.25, y + 0.5, label(owner), ha="right", va="center", fontsize=size + 1, weight="bold")
        for x, w, j, ids in _segments(table, shared, compress):
            fill, text, gid = _fill(pool.num_tokens.get(owner, -1), j, block_size), str(ids[0]), "table_cell"
            if len(ids) > 1:
                consecutive = ids == list(range(ids[0], ids[0] + len(ids)))
                fill, text, gid = 1.0, f"{ids[0]}–{ids[-1]}" if consecutive else f"{len(ids)} blocks", "table_run"
            (ec, lw), end = (SHARED, 3.5) if ids[0] in shared else (EDGE, 1.3), x + w
            cell = (x + 0.07, y + 0.07, w - 0.14, 0.86)
            box(ax, cell, inks[owner], fill, text=text, gid=gid, fontsize=size, ec=ec, lw=lw)
        if notes and notes.get(owner):
            ax.text(end + 0.2, y + 0.5, notes[owner], ha="left", va="center", fontsize=size - 1, color=MUTED)


def pool_legend(inks: Mapping[Hashable, Ink], pool: PoolState | None = None, queue: bool = False) -> list[Patch]:
    """Legend entries: the owners (up to ``LEGEND_MAX``), then what the ``pool``'s other looks mean."""
    names = list(inks)
    handles = [Patch(fc=inks[o].color, hatch=inks[o].hatch, ec=EDGE, label=str(o)) for o in names[:LEGEND_MAX]]
    if len(names) > LEGEND_MAX:
        handles.append(Patch(fc="white", ec="white", label=f"... {len(names) - LEGEND_MAX} more"))
    if pool is None:
        return handles
    if any(r > 0 and not pool.owners.get(b) for b, r in enumerate(pool.ref_cnt)):
        handles.append(Patch(fc=IN_USE, ec=EDGE, label="in use"))
    handles.append(Patch(fc=FREE, ec=EDGE, label="free" + (", qN = queue" if queue else "")))
    if any(r > 1 for r in pool.ref_cnt):
        handles.append(Patch(fc="white", ec=SHARED, lw=3, label="shared: ×ref_cnt"))
    if any(pool.is_cached(b) for b in range(len(pool.ref_cnt))):
        handles.append(Patch(fc=CACHED, ec=EDGE, hatch=CACHED_HATCH, label="free, cached"))
    return handles


def draw_pool(
    pool: PoolState | BlockPool | Sequence[int],
    owners: Mapping[int, Hashable | Sequence[Hashable]] | None = None,
    ncols: int | None = None,
    title: str | None = None,
    cached: Sequence[bool] | None = None,
    free_order: Sequence[int] | None = None,
    show_free_order: bool = True,
    inks: Mapping[Hashable, Ink] | None = None,
) -> Figure:
    """The physical pool as a grid of blocks, each coloured by its owner (:func:`pool_grid`).

    ``pool``: a :class:`PoolState`, or a ``BlockPool`` or a list of ref counts with ``owners`` (block
    id -> owner, or a list of owners for a shared block, see :func:`owners_from_tables`). ``cached`` and
    ``free_order`` override the state's. ``inks`` (owner -> :class:`~minipaged.viz.palette.Ink`,
    e.g. from :func:`~minipaged.viz.palette.inks_over_time`) keeps colours fixed over a run;
    by default the owners drawn get distinct colours.
    """
    if isinstance(pool, BlockPool):
        pool = PoolState.from_pool(pool, owners)
    elif not isinstance(pool, PoolState):
        pool = PoolState([int(r) for r in pool], owners=owner_lists(owners))
    elif owners is not None:
        pool = replace(pool, owners=owner_lists(owners))
    order = (list(free_order) if free_order is not None else pool.free_order) if show_free_order else None
    pool = replace(pool, cached=list(cached) if cached is not None else pool.cached, free_order=order)
    num_blocks = len(pool.ref_cnt)
    if num_blocks == 0:
        raise ValueError("nothing to draw: the pool has no blocks")
    present = natural_order(o for b, os in pool.owners.items() if b < num_blocks and pool.ref_cnt[b] for o in os)
    inks = dict(inks) if inks is not None else owner_inks(present)
    if missing := [o for o in present if o not in inks]:
        raise ValueError(
            f"inks has no colour for owners {missing[:5]}: build it from every frame's owners "
            "(palette.inks_over_time), or leave it out"
        )
    ncols = ncols or min(num_blocks, 16)
    nrows, cell = math.ceil(num_blocks / ncols), min(0.75, 12.0 / ncols)  # inches per block
    fig, ax = new_figure(max(ncols * cell + 0.4, 6.0), nrows * cell + 0.9 + 0.3 * math.ceil((len(present) + 5) / 8))
    pool_grid(ax, pool, inks, ncols, top=nrows)
    ax.set(xlim=(0, ncols), ylim=(0, nrows), aspect="equal")
    ax.axis("off")
    used = sum(1 for rc in pool.ref_cnt if rc > 0)
    summary = f"{num_blocks} blocks: {used} in use, {num_blocks - used} free"
    ax.set_title(f"{title}\n{summary}" if title else summary, loc="left")
    handles = pool_legend({o: inks[o] for o in present}, pool, queue=pool.free_order is not None)
    fig.legend(handles=handles, loc="outside lower left", ncols=8, frameon=False, fontsize=SMALL + 1, columnspacing=1.2)
    return fig


TableWithTokens = BlockTable | tuple[Sequence[int], int] | Sequence[int]  # see draw_block_tables


def _tables_of(
    tables: Mapping[K, TableWithTokens], block_size: int, num_tokens: Mapping[K, int] | None
) -> dict[K, tuple[list[int], int]]:
    """name -> (block ids, tokens) from BlockTables, (ids, tokens) pairs, or id lists + ``num_tokens``."""
    out: dict[K, tuple[list[int], int]] = {}
    for name, t in tables.items():
        block_ids, tokens = getattr(t, "block_ids", None), getattr(t, "num_tokens", None)
        if block_ids is not None and tokens is not None:  # a BlockTable, or any object like one
            ids, n = list(block_ids), int(tokens)
        elif isinstance(t, tuple) and len(t) == 2 and not isinstance(t[0], int):
            ids, n = list(t[0]), int(t[1])
        else:
            assert not isinstance(t, BlockTable)  # it has block_ids and num_tokens: the first case
            ids = list(t)
            n = int(num_tokens[name]) if num_tokens and name in num_tokens else len(ids) * block_size
        if n > len(ids) * block_size:
            raise ValueError(f"{name!r}: {n} tokens do not fit in {len(ids)} blocks of {block_size}")
        out[name] = ([int(b) for b in ids], n)
    return out


def _filled_slots(seqs: Mapping[K, tuple[list[int], int]], block_size: int, num_blocks: int) -> dict[int, int]:
    """Physical block -> slots holding tokens (the most any table mapping it fills); a table naming a
    block outside the pool of ``num_blocks`` is an error."""
    filled: dict[int, int] = {}
    for name, (ids, n) in seqs.items():
        for j, b in enumerate(ids):
            if not 0 <= b < num_blocks:
                raise ValueError(f"{name!r} maps logical block {j} to block {b}, outside the pool of {num_blocks}")
            filled[b] = max(filled.get(b, 0), min(block_size, max(0, n - j * block_size)))
    return filled


def draw_block_tables(
    tables: Mapping[K, TableWithTokens],
    block_size: int,
    num_blocks: int,
    num_tokens: Mapping[K, int] | None = None,
    ref_cnt: Sequence[int] | None = None,
    ncols: int | None = None,
    title: str | None = None,
) -> Figure:
    """Logical blocks -> block table -> physical blocks, an arrow per logical block.

    ``tables``: name -> a :class:`~minipaged.kv.block_table.BlockTable`, a ``(block_ids,
    num_tokens)`` pair, or a list of block ids whose token count comes from ``num_tokens``
    (as in ``StepSnapshot.block_tables`` / ``.num_tokens``; default: every block full).

    Left, each sequence's logical blocks cut into ``block_size`` slots, the filled ones coloured;
    middle, its block table (the physical id of each logical block); right, the pool of
    ``num_blocks`` physical blocks (``ncols`` columns) with the same slots filled. A block in
    several tables (or with ``ref_cnt > 1``) is shared: thick vermillion outline. ``ref_cnt``
    (optional, per physical block) greys out blocks in use by no table drawn.
    """
    seqs = _tables_of(tables, block_size, num_tokens)
    logical_rows = sum(max(1, len(ids)) for ids, _ in seqs.values()) + 0.6 * max(0, len(seqs) - 1)
    # One column of physical blocks while it is not much taller than the logical side: arrows
    # to a second column would cross the first.
    ncols = ncols or max(1, math.ceil(num_blocks / max(24, logical_rows)))
    pool_rows = math.ceil(num_blocks / ncols)
    inks = owner_inks(seqs)
    users = owners_from_tables({name: ids for name, (ids, _) in seqs.items()})
    filled = _filled_slots(seqs, block_size, num_blocks)
    LW, TX, TW, PX, PW, PGAP = 4.0, 5.4, 1.1, 8.6, 2.6, 1.0  # data units: logical | table | pool columns
    height, width = max(logical_rows, pool_rows), PX + ncols * (PW + PGAP)
    fig, ax = new_figure(max(10.0, 0.75 * width + 2.0), 0.5 * height + 1.8)

    def slotted(x: float, y: float, w: float, n_filled: int, ink: Ink, **kw: Any) -> None:
        """A block of ``block_size`` slots, the first ``n_filled`` coloured, with thin lines between slots."""
        box(ax, (x, y, w, 0.7), ink, n_filled / block_size, **kw)
        dividers = [x + w * s / block_size for s in range(1, block_size)] if block_size <= 64 else []
        ax.vlines(dividers, y, y + 0.7, color="#BBBBBB", lw=0.4)

    pool_top = height - (height - pool_rows) / 2
    pool_xy: dict[int, tuple[float, float]] = {}
    for b in range(num_blocks):  # the pool, top-down, column-major so that ncols=1 is a plain column
        x, y = pool_xy[b] = PX + b // pool_rows * (PW + PGAP), pool_top - b % pool_rows - 0.85
        who = users.get(b, [])
        rc = ref_cnt[b] if ref_cnt is not None and b < len(ref_cnt) else len(who)
        ec, lw = (SHARED, 3.5) if len(who) > 1 or rc > 1 else (EDGE, 1.2)
        ink = inks[who[0]] if who else Ink(IN_USE)
        slotted(x, y, PW, filled[b] if who else block_size * (rc > 0), ink, gid="physical", ec=ec, lw=lw)
        weight, color = "bold" if who else "normal", "black" if (who or rc) else "#888888"
        ax.text(x - 0.1, y + 0.35, str(b), ha="right", va="center", fontsize=FONT_SIZE - 3, weight=weight, color=color)
    y, tip = height - (height - logical_rows) / 2, "-|>"
    for name, (ids, n) in seqs.items():  # the sequences, top-down
        if not ids:
            y -= 1
            ax.text(LW / 2, y + 0.5, f"{name}: no blocks yet", ha="center", va="center", fontsize=FONT_SIZE - 2)
        for j, b in enumerate(ids):
            y -= 1
            yb, ink = y + 0.15, inks[name]
            slotted(0, yb, LW, min(block_size, max(0, n - j * block_size)), ink, lw=1.2, gid="logical")
            ax.text(-0.15, yb + 0.35, f"{name} #{j}", ha="right", va="center", fontsize=FONT_SIZE - 2)
            box(ax, (TX, yb, TW, 0.7), Ink("white"), text=str(b), ec=ink.color, lw=2, gid="table", fontsize=13)
            end = (pool_xy[b][0] - 0.55, pool_xy[b][1] + 0.35)
            start, into = (LW + 0.1, yb + 0.35), (TX - 0.05, yb + 0.35)
            ax.add_patch(FancyArrowPatch(start, into, arrowstyle=tip, mutation_scale=14, color="#666666", lw=1))
            start = (TX + TW + 0.05, yb + 0.35)
            arrow = FancyArrowPatch(start, end, arrowstyle=tip, mutation_scale=14, color=ink.color, lw=1.8, gid="arrow")
            ax.add_patch(arrow)
        y -= 0.6
    heads = {"logical blocks": LW / 2, "block table": TX + TW / 2, "physical blocks": (PX + width - PGAP) / 2}
    for label, x in heads.items():
        ax.text(x, height + 0.25, label, ha="center", va="bottom", fontsize=FONT_SIZE - 1, weight="bold")
    ax.set(xlim=(-1.6, width), ylim=(-0.2, height + 1.0))
    ax.axis("off")
    tokens = ", ".join(f"{name}: {n} tokens" for name, (_, n) in seqs.items())
    head = title or f"block size {block_size}"
    ax.set_title(f"{head}\n{tokens}" if tokens else head, loc="left")
    handles = pool_legend(inks)
    if any(len(u) > 1 for u in users.values()) or (ref_cnt is not None and any(r > 1 for r in ref_cnt)):
        handles.append(Patch(fc="white", ec=SHARED, lw=3, label="shared"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1), frameon=False)
    return fig
