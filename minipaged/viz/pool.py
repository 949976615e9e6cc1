"""Pictures of paged KV memory: the block pool (stage 1) and block tables (stage 2).

:func:`draw_pool` draws a :class:`~minipaged.viz.blocks.PoolState` (or a ``BlockPool``, or a list
of ref counts) as a grid; :func:`draw_block_tables` draws sequences' logical blocks, their tables
and the physical blocks, one arrow per logical block. Both return a ``Figure`` without showing
it. Patches carry a ``gid`` (``"block"``, ``"logical"``, ``"slot"``, ``"table"``, ``"physical"``,
``"arrow"``) so tests can count them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from minipaged.kv.block_pool import BlockPool
from minipaged.viz.blocks import PoolState, owners_from_tables, pool_grid, pool_legend
from minipaged.viz.palette import IN_USE, SHARED, Ink, natural_order, owner_inks
from minipaged.viz.style import EDGE, FONT_SIZE, SMALL, box, new_figure

__all__ = ["PoolState", "draw_block_tables", "draw_pool", "owners_from_tables"]


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

    ``pool``: a :class:`PoolState`; a ``BlockPool`` or a list of ref counts is turned into one
    (:meth:`PoolState.from_pool`, :meth:`PoolState.from_ref_cnt`) with ``owners`` (block id ->
    owner, or a list of owners for a shared block, see :func:`owners_from_tables`). ``cached`` and
    ``free_order`` override the state's. ``inks`` (owner -> :class:`~minipaged.viz.palette.Ink`,
    e.g. from :func:`~minipaged.viz.palette.inks_over_time`) keeps colours fixed over a run;
    by default the owners drawn get distinct colours.
    """
    if isinstance(pool, BlockPool):
        pool = PoolState.from_pool(pool, owners)
    elif not isinstance(pool, PoolState):
        pool = PoolState.from_ref_cnt(pool, owners)
    elif owners is not None:
        pool = replace(pool, owners=PoolState.from_ref_cnt(pool.ref_cnt, owners).owners)
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


def _tables_of(tables: Mapping, block_size: int, num_tokens: Mapping | None) -> dict[Hashable, tuple[list[int], int]]:
    """name -> (block ids, tokens) from BlockTables, (ids, tokens) pairs, or id lists + ``num_tokens``."""
    out = {}
    for name, t in tables.items():
        if hasattr(t, "block_ids") and hasattr(t, "num_tokens"):
            ids, n = list(t.block_ids), int(t.num_tokens)
        elif isinstance(t, tuple) and len(t) == 2 and not isinstance(t[0], int):
            ids, n = list(t[0]), int(t[1])
        else:
            ids = list(t)
            n = int(num_tokens[name]) if num_tokens and name in num_tokens else len(ids) * block_size
        if n > len(ids) * block_size:
            raise ValueError(f"{name!r}: {n} tokens do not fit in {len(ids)} blocks of {block_size}")
        out[name] = ([int(b) for b in ids], n)
    return out


def draw_block_tables(
    tables: Mapping,
    block_size: int,
    num_blocks: int,
    num_tokens: Mapping[Hashable, int] | None = None,
    ref_cnt: Sequence[int] | None = None,
    ncols: int | None = None,
    title: str | None = None,
) -> Figure:
    """Logical blocks -> block table -> physical blocks, one arrow per logical block.

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
    filled: dict[int, int] = {}  # physical block -> slots holding tokens
    for name, (ids, n) in seqs.items():
        for j, b in enumerate(ids):
            if not 0 <= b < num_blocks:
                raise ValueError(f"{name!r} maps logical block {j} to block {b}, outside the pool of {num_blocks}")
            filled[b] = max(filled.get(b, 0), min(block_size, max(0, n - j * block_size)))
    LW, TX, TW, PX, PW, PGAP = 4.0, 5.4, 1.1, 8.6, 2.6, 1.0  # data units: logical | table | pool columns
    height, width = max(logical_rows, pool_rows), PX + ncols * (PW + PGAP)
    fig, ax = new_figure(max(10.0, 0.75 * width + 2.0), 0.5 * height + 1.8)

    def slots(x0: float, y0: float, w: float, n_filled: int, ink: Ink) -> None:
        if block_size > 64:  # too many to draw one by one: the filled share as one bar
            ax.add_patch(Rectangle((x0, y0), w * n_filled / block_size, 0.7, fc=ink.color, hatch=ink.hatch, gid="slot"))
            return
        for s in range(block_size):
            face, hatch = (ink.color, ink.hatch) if s < n_filled else ("white", None)
            sw = w / block_size
            ax.add_patch(Rectangle((x0 + s * sw, y0), sw, 0.7, fc=face, hatch=hatch, ec="#BBBBBB", lw=0.4, gid="slot"))

    pool_top, pool_xy = height - (height - pool_rows) / 2, {}
    for b in range(num_blocks):  # the pool, top-down, column-major so that ncols=1 is a plain column
        col, row = divmod(b, pool_rows)
        x, y = PX + col * (PW + PGAP), pool_top - row - 0.85
        who, pool_xy[b] = users.get(b, []), (x, y)
        rc = ref_cnt[b] if ref_cnt is not None and b < len(ref_cnt) else len(who)
        if who:
            slots(x, y, PW, filled[b], inks[who[0]])
        elif rc > 0:
            ax.add_patch(Rectangle((x, y), PW, 0.7, fc=IN_USE, lw=0, gid="slot"))
        shared = len(who) > 1 or rc > 1
        ax.add_patch(Rectangle((x, y), PW, 0.7, fill=False, ec=SHARED if shared else EDGE, lw=3.5 if shared else 1.2))
        ax.patches[-1].set_gid("physical")
        style = dict(weight="bold" if who else "normal", color="black" if (who or rc) else "#888888")
        ax.text(x - 0.1, y + 0.35, str(b), ha="right", va="center", fontsize=FONT_SIZE - 3, **style)

    y = height - (height - logical_rows) / 2
    for name, (ids, n) in seqs.items():  # the sequences, top-down
        ink = inks[name]
        if not ids:
            y -= 1
            ax.text(LW / 2, y + 0.5, f"{name}: no blocks yet", ha="center", va="center", fontsize=FONT_SIZE - 2)
        for j, b in enumerate(ids):
            y -= 1
            yb = y + 0.15
            slots(0, yb, LW, min(block_size, max(0, n - j * block_size)), ink)
            ax.add_patch(Rectangle((0, yb), LW, 0.7, fill=False, ec=EDGE, lw=1.2, gid="logical"))
            ax.text(-0.15, yb + 0.35, f"{name} #{j}", ha="right", va="center", fontsize=FONT_SIZE - 2)
            box(
                ax,
                (TX, yb, TW, 0.7),
                Ink("white"),
                text=str(b),
                ec=ink.color,
                lw=2,
                gid="table",
                fontsize=FONT_SIZE - 1,
            )
            tip, end = dict(arrowstyle="-|>", mutation_scale=14), (pool_xy[b][0] - 0.55, pool_xy[b][1] + 0.35)
            ax.add_patch(FancyArrowPatch((LW + 0.1, yb + 0.35), (TX - 0.05, yb + 0.35), color="#666666", lw=1, **tip))
            ax.add_patch(FancyArrowPatch((TX + TW + 0.05, yb + 0.35), end, color=ink.color, lw=1.8, gid="arrow", **tip))
        y -= 0.6
    for x, label in zip(
        (LW / 2, TX + TW / 2, (PX + width - PGAP) / 2), ("logical blocks", "block table", "physical blocks")
    ):
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
