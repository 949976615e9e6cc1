"""Pictures of paged KV memory: the block pool (stage 1) and block tables (stage 2).

:func:`draw_pool` draws a :class:`PoolState` (build one from a ``BlockPool``, a ``StepSnapshot``
or a list of ref counts with its ``from_*`` constructors); :func:`draw_block_tables` draws
sequences' tables. Both return a ``Figure`` without showing it. Patches carry a ``gid``
(``"block"``, ``"logical"``, ``"slot"``, ``"table"``, ``"physical"``, ``"arrow"``) so tests can
count them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from minipaged.kv.block_pool import BlockPool
from minipaged.utils import cdiv
from minipaged.viz.palette import (
    CACHED,
    CACHED_HATCH,
    FREE,
    IN_USE,
    MUTED,
    SHARED,
    Ink,
    natural_order,
    owner_inks,
    text_color,
)
from minipaged.viz.style import FONT_SIZE, SMALL, new_figure

LEGEND_MAX = 16  # owners listed in a legend; more are summed up in one line
LEGEND_COLS = 8


def owners_from_tables(block_tables: Mapping[Hashable, Sequence[int]]) -> dict[int, list[Hashable]]:
    """block id -> the owners whose tables hold it (several for a shared block), in table order.

    ``block_tables`` maps an owner to its block ids (a list, or a ``BlockTable``).
    """
    owners: dict[int, list[Hashable]] = {}
    for owner, table in block_tables.items():
        for block_id in getattr(table, "block_ids", table):
            if owner not in owners.setdefault(int(block_id), []):
                owners[int(block_id)].append(owner)
    return owners


@dataclass
class PoolState:
    """A block pool in plain form: per block ``ref_cnt`` (and ``cached``), the free queue's order
    (``free_order[0]`` is handed out next; ``None`` if unknown), and block id -> its owners."""

    ref_cnt: list[int]
    cached: list[bool] = field(default_factory=list)
    free_order: list[int] | None = None
    owners: dict[int, list[Hashable]] = field(default_factory=dict)

    @classmethod
    def from_pool(cls, pool: BlockPool, owners: Mapping | None = None) -> PoolState:
        return cls(
            [b.ref_cnt for b in pool.blocks],
            [b.block_hash is not None for b in pool.blocks],
            [b.block_id for b in pool.free_queue],
            _owner_lists(owners),
        )

    @classmethod
    def from_snapshot(cls, snapshot) -> PoolState:
        """From an engine ``StepSnapshot``: its ``ref_cnt``, ``cached`` and block tables (the owners)."""
        return cls(list(snapshot.ref_cnt), list(snapshot.cached or []), None, owners_from_tables(snapshot.block_tables))

    @classmethod
    def from_ref_cnt(
        cls, ref_cnt: Sequence[int], owners: Mapping | None = None, free_order: Sequence[int] | None = None
    ) -> PoolState:
        return cls(
            [int(r) for r in ref_cnt], [], None if free_order is None else list(free_order), _owner_lists(owners)
        )


def _owner_lists(owners: Mapping | None) -> dict[int, list[Hashable]]:
    """block id -> owner, or -> a list of owners (a shared block), as block id -> list."""
    return {int(b): (list(o) if isinstance(o, (list, tuple)) else [o]) for b, o in (owners or {}).items()}


def _owner_legend(inks: Mapping[Hashable, Ink]) -> list[Patch]:
    names = list(inks)
    handles = [
        Patch(facecolor=inks[o].color, hatch=inks[o].hatch, edgecolor="#444444", label=str(o))
        for o in names[:LEGEND_MAX]
    ]
    if len(names) > LEGEND_MAX:
        handles.append(Patch(facecolor="white", edgecolor="white", label=f"... {len(names) - LEGEND_MAX} more"))
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
    """The physical pool as a grid of blocks, each coloured by its owner.

    ``pool``: a :class:`PoolState`; a ``BlockPool`` or a list of ref counts is turned into one
    (:meth:`PoolState.from_pool`, :meth:`PoolState.from_ref_cnt`) with ``owners`` (block id ->
    owner, or a list of owners for a shared block, see :func:`owners_from_tables`). ``cached`` and
    ``free_order`` override the state's. ``inks`` (owner -> :class:`~minipaged.viz.palette.Ink`,
    e.g. from :func:`~minipaged.viz.palette.inks_over_time`) keeps colours fixed over a run;
    by default the owners drawn get distinct colours.

    Each cell shows its block id (top left) and its owner(s). A shared block (``ref_cnt > 1``)
    gets a thick vermillion outline and ``×n``; a free block is light grey, with its place in the
    free queue (``q0`` is handed out next) when known; a free block that still holds a cached
    prefix (stage 6) is pale blue and dotted.
    """
    if isinstance(pool, BlockPool):
        pool = PoolState.from_pool(pool, owners)
    elif not isinstance(pool, PoolState):
        pool = PoolState.from_ref_cnt(pool, owners)
    elif owners is not None:
        pool = PoolState(pool.ref_cnt, pool.cached, pool.free_order, _owner_lists(owners))
    num_blocks = len(pool.ref_cnt)
    if num_blocks == 0:
        raise ValueError("nothing to draw: the pool has no blocks")
    cached = list(cached) if cached is not None else pool.cached
    free_order = free_order if free_order is not None else pool.free_order
    queue_pos = {b: i for i, b in enumerate(free_order)} if (free_order is not None and show_free_order) else {}
    live = {b: o for b, o in pool.owners.items() if b < num_blocks and pool.ref_cnt[b] > 0}
    present = natural_order(o for os in live.values() for o in os)
    inks = dict(inks) if inks is not None else owner_inks(present)
    missing = [o for o in present if o not in inks]
    if missing:
        raise ValueError(
            f"inks has no colour for owners {missing[:5]}: build it from every frame's owners "
            "(palette.inks_over_time), or leave it out"
        )

    ncols = ncols or min(num_blocks, 16)
    nrows = math.ceil(num_blocks / ncols)
    cell = min(0.75, 12.0 / ncols)  # inches per block
    legend_rows = cdiv(min(len(present), LEGEND_MAX + 1) + 4, LEGEND_COLS)
    fig, ax = new_figure(max(ncols * cell + 0.4, 6.0), nrows * cell + 0.9 + 0.3 * legend_rows)
    for block_id, rc in enumerate(pool.ref_cnt):
        row, col = divmod(block_id, ncols)
        x, y = col, nrows - 1 - row
        block_owners = live.get(block_id, [])
        is_cached = block_id < len(cached) and cached[block_id] and rc == 0
        ink = inks[block_owners[0]] if block_owners else Ink(IN_USE if rc > 0 else (CACHED if is_cached else FREE))
        shared = rc > 1
        ax.add_patch(
            Rectangle(
                (x + 0.05, y + 0.05),
                0.9,
                0.9,
                facecolor=ink.color,
                hatch=CACHED_HATCH if is_cached else ink.hatch,
                edgecolor=SHARED if shared else "#444444",
                lw=4 if shared else 1,
                gid="block",
            )
        )
        ink_text = text_color(ink.color)
        ax.text(x + 0.1, y + 0.9, str(block_id), ha="left", va="top", fontsize=SMALL, color=ink_text)
        if block_owners:
            name = ",".join(str(o) for o in block_owners)
            ax.text(
                x + 0.5,
                y + (0.5 if not shared else 0.55),
                name if len(name) <= 5 else name[:4] + "…",
                ha="center",
                va="center",
                fontsize=FONT_SIZE - 1 if len(name) <= 3 else SMALL + 1,
                color=ink_text,
                fontweight="bold",
            )
        if shared:  # only sharing is worth a number: every block in use has ref_cnt >= 1
            ax.text(
                x + 0.9,
                y + 0.1,
                f"×{rc}",
                ha="right",
                va="bottom",
                fontsize=SMALL + 1,
                fontweight="bold",
                color=ink_text,
            )
        elif rc == 0 and block_id in queue_pos:
            ax.text(x + 0.9, y + 0.1, f"q{queue_pos[block_id]}", ha="right", va="bottom", fontsize=SMALL, color=MUTED)
    ax.set_xlim(0, ncols)
    ax.set_ylim(0, nrows)
    ax.set_aspect("equal")
    ax.axis("off")
    used = sum(1 for rc in pool.ref_cnt if rc > 0)
    summary = f"{num_blocks} blocks: {used} in use, {num_blocks - used} free"
    ax.set_title(f"{title}\n{summary}" if title else summary, loc="left")
    handles = _owner_legend({o: inks[o] for o in present})
    if any(rc > 0 and b not in live for b, rc in enumerate(pool.ref_cnt)):
        handles.append(Patch(facecolor=IN_USE, edgecolor="#444444", label="in use"))
    handles.append(Patch(facecolor=FREE, edgecolor="#444444", label="free" + (", qN = queue" if queue_pos else "")))
    if any(rc > 1 for rc in pool.ref_cnt):
        handles.append(Patch(facecolor="white", edgecolor=SHARED, lw=3, label="shared: ×ref_cnt"))
    if any(c and rc == 0 for c, rc in zip(cached, pool.ref_cnt)):
        handles.append(Patch(facecolor=CACHED, edgecolor="#444444", hatch=CACHED_HATCH, label="free, cached"))
    fig.legend(
        handles=handles,
        loc="outside lower left",
        ncols=LEGEND_COLS,
        frameon=False,
        fontsize=SMALL + 1,
        columnspacing=1.2,
        handlelength=1.5,
    )
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
    draw_slots = block_size <= 64

    # Physical view: which sequences use each block and how many of its slots hold tokens.
    users: dict[int, list[Hashable]] = {}
    filled: dict[int, int] = {}
    for name, (ids, n) in seqs.items():
        for j, b in enumerate(ids):
            if not 0 <= b < num_blocks:
                raise ValueError(f"{name!r} maps logical block {j} to block {b}, outside the pool of {num_blocks}")
            users.setdefault(b, []).append(name)
            filled[b] = max(filled.get(b, 0), min(block_size, max(0, n - j * block_size)))

    # Geometry (data units): logical blocks at x 0..LW, table cells at TX, pool from PX.
    LW, TX, TW = 4.0, 5.4, 1.1
    PX, PW, PGAP = 8.6, 2.6, 1.0
    height = max(logical_rows, pool_rows)
    width = PX + ncols * (PW + PGAP)
    fig, ax = new_figure(max(10.0, 0.75 * width + 2.0), 0.5 * height + 1.8)

    def slot_cells(x0: float, y0: float, w: float, n_filled: int, ink: Ink) -> None:
        if draw_slots:
            sw = w / block_size
            for s in range(block_size):
                face = (ink.color, ink.hatch) if s < n_filled else ("white", None)
                ax.add_patch(
                    Rectangle(
                        (x0 + s * sw, y0),
                        sw,
                        0.7,
                        facecolor=face[0],
                        hatch=face[1],
                        edgecolor="#BBBBBB",
                        lw=0.4,
                        gid="slot",
                    )
                )
        elif n_filled:
            ax.add_patch(
                Rectangle(
                    (x0, y0), w * n_filled / block_size, 0.7, facecolor=ink.color, hatch=ink.hatch, lw=0, gid="slot"
                )
            )

    # Pool, top-down, column-major so that ncols=1 is a plain column.
    pool_top = height - (height - pool_rows) / 2
    pool_xy = {}
    for b in range(num_blocks):
        col, row = divmod(b, pool_rows)
        x, y = PX + col * (PW + PGAP), pool_top - row - 0.85
        pool_xy[b] = (x, y)
        who = users.get(b, [])
        rc = ref_cnt[b] if ref_cnt is not None and b < len(ref_cnt) else len(who)
        if who:
            slot_cells(x, y, PW, filled[b], inks[who[0]])
        elif rc > 0:
            ax.add_patch(Rectangle((x, y), PW, 0.7, facecolor=IN_USE, lw=0, gid="slot"))
        shared = len(who) > 1 or rc > 1
        ax.add_patch(
            Rectangle(
                (x, y),
                PW,
                0.7,
                fill=False,
                edgecolor=SHARED if shared else "#444444",
                lw=3.5 if shared else 1.2,
                gid="physical",
            )
        )
        ax.text(
            x - 0.1,
            y + 0.35,
            str(b),
            ha="right",
            va="center",
            fontsize=FONT_SIZE - 3,
            fontweight="bold" if who else "normal",
            color="black" if (who or rc) else "#888888",
        )

    # Sequences, top-down.
    y = height - (height - logical_rows) / 2
    for name, (ids, n) in seqs.items():
        ink = inks[name]
        if not ids:
            y -= 1
            ax.text(LW / 2, y + 0.5, f"{name}: no blocks yet", ha="center", va="center", fontsize=FONT_SIZE - 2)
        for j, b in enumerate(ids):
            y -= 1
            yb = y + 0.15
            slot_cells(0, yb, LW, min(block_size, max(0, n - j * block_size)), ink)
            ax.add_patch(Rectangle((0, yb), LW, 0.7, fill=False, edgecolor="#444444", lw=1.2, gid="logical"))
            ax.text(-0.15, yb + 0.35, f"{name} #{j}", ha="right", va="center", fontsize=FONT_SIZE - 2)
            ax.add_patch(Rectangle((TX, yb), TW, 0.7, facecolor="white", edgecolor=ink.color, lw=2, gid="table"))
            ax.text(TX + TW / 2, yb + 0.35, str(b), ha="center", va="center", fontsize=FONT_SIZE - 1)
            ax.add_patch(
                FancyArrowPatch(
                    (LW + 0.1, yb + 0.35),
                    (TX - 0.05, yb + 0.35),
                    arrowstyle="-|>",
                    mutation_scale=12,
                    color="#666666",
                    lw=1,
                )
            )
            px, py = pool_xy[b]
            ax.add_patch(
                FancyArrowPatch(
                    (TX + TW + 0.05, yb + 0.35),
                    (px - 0.55, py + 0.35),
                    arrowstyle="-|>",
                    mutation_scale=16,
                    color=ink.color,
                    lw=1.8,
                    gid="arrow",
                )
            )
        y -= 0.6

    for x, label in (
        (LW / 2, "logical blocks"),
        (TX + TW / 2, "block table"),
        (PX + (ncols * (PW + PGAP) - PGAP) / 2, "physical blocks"),
    ):
        ax.text(x, height + 0.25, label, ha="center", va="bottom", fontsize=FONT_SIZE - 1, fontweight="bold")
    ax.set_xlim(-1.6, width)
    ax.set_ylim(-0.2, height + 1.0)
    ax.axis("off")
    tokens = ", ".join(f"{name}: {n} tokens" for name, (_, n) in seqs.items())
    head = title or f"block size {block_size}"
    ax.set_title(f"{head}\n{tokens}" if tokens else head, loc="left")
    handles = _owner_legend(inks)
    if any(len(u) > 1 for u in users.values()) or (ref_cnt is not None and any(r > 1 for r in ref_cnt)):
        handles.append(Patch(facecolor="white", edgecolor=SHARED, lw=3, label="shared"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1), frameon=False)
    return fig
