"""What every picture of a paged pool is made of, so a block looks the same in all of them.

- :class:`PoolState`: a pool in plain form (per-block ``ref_cnt`` and ``cached``, the free queue,
  each block's owners and, when known, the owners' block tables and token counts);
- :func:`pool_grid`: the physical blocks as a grid, coloured by owner; a shared block outlined in
  vermillion with ``×ref_cnt``; a free block grey, or pale blue and dotted while it still holds a
  cached prefix;
- :func:`table_rows`: one row of blocks per sequence, the coloured part of a block holding tokens;
- :func:`pool_legend`: what those looks mean.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from matplotlib.patches import Patch

from minipaged.kv.block_pool import BlockPool
from minipaged.viz.palette import CACHED, CACHED_HATCH, FREE, IN_USE, MUTED, SHARED, Ink
from minipaged.viz.style import EDGE, HALO, SMALL, box

LEGEND_MAX = 16  # owners listed in a legend; more are summed up in one line
COMPRESS_AT, RUN_MIN, RUN_W = 12, 3, 3.0  # tables longer than 12 draw a run of >= 3 shared blocks as one cell
Labels = Mapping[Hashable, str] | Sequence[str] | None


def owners_from_tables(block_tables: Mapping[Hashable, Sequence[int]]) -> dict[int, list[Hashable]]:
    """block id -> the owners whose tables (lists of block ids, or ``BlockTable``s) hold it, in table order."""
    owners: dict[int, list[Hashable]] = {}
    for owner, table in block_tables.items():
        for b in getattr(table, "block_ids", table):
            if owner not in owners.setdefault(int(b), []):
                owners[int(b)].append(owner)
    return owners


def _labels(keys: list[Hashable], labels: Labels) -> list[str]:
    """A label per key, from ``labels`` (a mapping, or a list in key order); default ``k`` for a string, ``seq k``."""
    if labels is not None and not isinstance(labels, Mapping):
        if len(labels) < len(keys):
            raise ValueError(f"{len(labels)} labels for {len(keys)} block tables")
        return [str(x) for x in list(labels)[: len(keys)]]
    return [str((labels or {}).get(k, k if isinstance(k, str) else f"seq {k}")) for k in keys]


@dataclass
class PoolState:
    """A block pool in plain form: per block ``ref_cnt`` and ``cached``, the free queue's order
    (``free_order[0]`` is handed out next; None: unknown), block id -> its ``owners``, and, when
    built from block tables, ``tables`` (owner -> block ids) and ``num_tokens`` (-1: unknown)."""

    ref_cnt: list[int]
    cached: list[bool] = field(default_factory=list)
    free_order: list[int] | None = None
    owners: dict[int, list[Hashable]] = field(default_factory=dict)
    tables: dict[Hashable, list[int]] = field(default_factory=dict)
    num_tokens: dict[Hashable, int] = field(default_factory=dict)

    @classmethod
    def from_pool(cls, pool: BlockPool, owners: Mapping | None = None) -> PoolState:
        """From a ``BlockPool``; ``owners``: block id -> owner, or a list of owners for a shared block."""
        cached = [b.block_hash is not None for b in pool.blocks]
        return cls([b.ref_cnt for b in pool.blocks], cached, [b.block_id for b in pool.free_queue], _lists(owners))

    @classmethod
    def from_ref_cnt(cls, ref_cnt: Sequence[int], owners: Mapping | None = None, free_order=None) -> PoolState:
        order = None if free_order is None else list(free_order)
        return cls([int(r) for r in ref_cnt], [], order, _lists(owners))

    @classmethod
    def from_tables(
        cls, tables: Mapping, num_tokens: Mapping | None = None, ref_cnt=None, cached=None, labels: Labels = None
    ) -> PoolState:
        """From ``key -> block ids``, and optionally ``key -> tokens``, per-block ``ref_cnt`` (default:
        how many tables hold the block) and ``cached``; owners are named by ``labels`` (see :func:`_labels`)."""
        keys = list(tables)
        names = _labels(keys, labels)
        if len(set(names)) != len(names):
            raise ValueError(f"labels must be distinct, got {names}")
        ids = {n: [int(b) for b in getattr(tables[k], "block_ids", tables[k])] for n, k in zip(names, keys)}
        given = num_tokens or {}
        tokens = {n: -1 if given.get(k) is None else int(given[k]) for n, k in zip(names, keys)}
        owners = owners_from_tables(ids)
        highest = max(owners, default=-1)
        ref_cnt = [int(r) for r in ref_cnt] if ref_cnt else [len(owners.get(b, [])) for b in range(highest + 1)]
        if highest >= len(ref_cnt):
            raise ValueError(f"block {highest} is outside the {len(ref_cnt)} blocks of ref_cnt")
        cached = ([bool(c) for c in cached or []] + [False] * len(ref_cnt))[: len(ref_cnt)]
        return cls(ref_cnt, cached, None, owners, ids, tokens)

    @classmethod
    def from_snapshot(cls, snapshot, labels: Labels = None) -> PoolState:
        """From an engine ``StepSnapshot``: its block tables, token counts, ``ref_cnt`` and ``cached``."""
        return cls.from_tables(snapshot.block_tables, snapshot.num_tokens, snapshot.ref_cnt, snapshot.cached, labels)

    def is_cached(self, b: int) -> bool:
        """Free, but still holding a cached prefix."""
        return self.ref_cnt[b] == 0 and b < len(self.cached) and self.cached[b]

    def shared_blocks(self) -> set[int]:
        """Blocks with ``ref_cnt > 1`` or more than one owner."""
        return {b for b, o in self.owners.items() if len(o) > 1} | {b for b, r in enumerate(self.ref_cnt) if r > 1}

    def block_fill(self, block_size: int) -> dict[int, float]:
        """Block -> the share of its slots that hold tokens (its fullest holder's view; unknown: full)."""
        out: dict[int, float] = {}
        for owner, table in self.tables.items():
            for j, b in enumerate(table):
                out[b] = max(out.get(b, 0.0), _fill(self.num_tokens.get(owner, -1), j, block_size))
        return out


def _lists(owners: Mapping | None) -> dict[int, list[Hashable]]:
    """block id -> owner, or -> a list of owners (a shared block), as block id -> list."""
    return {int(b): (list(o) if isinstance(o, (list, tuple)) else [o]) for b, o in (owners or {}).items()}


def _fill(num_tokens: int, j: int, block_size: int) -> float:
    """The share of logical block ``j`` of a sequence of ``num_tokens`` tokens that holds tokens (-1: full)."""
    return 1.0 if num_tokens < 0 else min(block_size, max(0, num_tokens - j * block_size)) / block_size


def pool_grid(
    ax, pool: PoolState, inks: Mapping, ncols: int, *, top=0.0, x0=0.0, fill=None, tags=None, label=str, size=SMALL + 1
) -> dict[int, tuple[float, float]]:
    """Every block of ``pool`` as a unit cell, block 0 at (``x0``, ``top - 1``), rows going down.

    A cell has its block id in the corner; in the middle, its ``tags`` entry (e.g. ``"evicted"``),
    or its owners' names (``label`` turns an owner into text; None: ``×ref_cnt`` of a shared block);
    in the other corner ``×ref_cnt`` when shared, or ``qN``, its place in the free queue, when free.
    Its colour is its first owner's (``inks``), its filled share ``fill[b]`` (default: full).
    Returns block -> (x, y) of its cell.
    """
    queue, xy = {b: i for i, b in enumerate(pool.free_order or [])}, {}
    for b, rc in enumerate(pool.ref_cnt):
        x, y = xy[b] = x0 + b % ncols, top - 1 - b // ncols
        who = pool.owners.get(b, []) if rc else []
        ink = inks[who[0]] if who else Ink(IN_USE) if rc else Ink(FREE)
        ink = Ink(CACHED, CACHED_HATCH) if pool.is_cached(b) else ink
        edge = dict(ec=SHARED, lw=3.5) if rc > 1 else dict(ec=EDGE, lw=1)
        box(ax, (x + 0.05, y + 0.05, 0.9, 0.9), ink, (fill or {}).get(b, 1.0), gid="block", **edge)
        shared = f"×{rc}" if rc > 1 else ""
        names = ",".join(map(label, who)) if label else shared
        middle = (tags or {}).get(b) or (names[:5] + "…" if len(names) > 6 else names)
        corner = shared if middle != shared else f"q{queue[b]}" if rc == 0 and b in queue else ""
        text = dict(path_effects=HALO, color="black" if rc else MUTED, weight="bold")
        ax.text(x + 0.5, y + 0.45, middle, ha="center", va="center", fontsize=size + 2 * (len(middle) <= 3), **text)
        ax.text(x + 0.1, y + 0.88, str(b), ha="left", va="top", fontsize=size - 1, **{**text, "weight": "normal"})
        ax.text(x + 0.9, y + 0.1, corner, ha="right", va="bottom", fontsize=size - 1, **text)
    return xy


def _segments(table: Sequence[int], shared: set[int], compress: bool) -> list[tuple[float, float, int, list[int]]]:
    """(x, width, first logical index, block ids) per cell of a table; a run of shared blocks may be one wide cell."""
    out, x, j = [], 0.0, 0
    while j < len(table):
        k = j
        while compress and k < len(table) and table[k] in shared:
            k += 1
        k = k if k - j >= RUN_MIN else j + 1
        out.append((x, RUN_W if k - j > 1 else 1.0, j, list(table[j:k])))
        x, j = x + out[-1][1], k
    return out


def table_width(tables: Mapping[Hashable, Sequence[int]], shared: set[int]) -> float:
    """How wide :func:`table_rows` draws the longest of ``tables`` (in cells)."""
    compress = max(map(len, tables.values()), default=0) > COMPRESS_AT
    return max((sum(s[1] for s in _segments(t, shared, compress)) for t in tables.values()), default=0.0)


def table_rows(ax, pool: PoolState, block_size: int, inks: Mapping, *, top=0.0, label=str, notes=None, size=SMALL + 1):
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
            edge, end = dict(ec=SHARED, lw=3.5) if ids[0] in shared else dict(ec=EDGE, lw=1.3), x + w
            box(ax, (x + 0.07, y + 0.07, w - 0.14, 0.86), inks[owner], fill, text=text, gid=gid, fontsize=size, **edge)
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
