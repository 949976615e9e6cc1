"""A block pool in plain form, for drawing: :class:`PoolState` (per block ``ref_cnt``, ``cached``,
owners; per table its blocks and tokens), built from a ``BlockPool``, block tables or a ``StepSnapshot``.
:mod:`minipaged.viz.pool` draws it (and re-exports these names)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from minipaged.kv.block_pool import BlockPool
from minipaged.kv.block_table import BlockTable

K = TypeVar("K", bound=Hashable)  # an owner: a sequence id, a name, ...
Labels = Mapping[Any, str] | Sequence[str] | None  # owner (keys as the tables') -> label, or labels in table order
Table = Sequence[int] | BlockTable  # block ids, or a BlockTable (its block_ids)
OwnerLabel = Callable[[Hashable], str]

if TYPE_CHECKING:
    from minipaged.viz.snapshot import StepSnapshot


def owners_from_tables(block_tables: Mapping[K, Table]) -> dict[int, list[Hashable]]:
    """block id -> the owners whose tables (lists of block ids, or ``BlockTable``s) hold it, in table order."""
    owners: dict[int, list[Hashable]] = {}
    for owner, table in block_tables.items():
        for b in _block_ids(table):
            if owner not in owners.setdefault(int(b), []):
                owners[int(b)].append(owner)
    return owners


@dataclass
class PoolState:
    """A block pool in plain form: per block ``ref_cnt`` and ``cached``, the free queue's order
    (``free_order[0]`` is handed out next; None: unknown), block id -> its ``owners`` (an owner, or a
    list for a shared block) and, when built from block tables, ``tables`` (owner -> block ids) and
    ``num_tokens`` (-1: unknown)."""

    ref_cnt: list[int]
    cached: list[bool] = field(default_factory=list)
    free_order: list[int] | None = None
    owners: dict[int, list[Hashable]] = field(default_factory=dict)
    tables: dict[Hashable, list[int]] = field(default_factory=dict)
    num_tokens: dict[Hashable, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.owners = {int(b): list(o) if isinstance(o, (list, tuple)) else [o] for b, o in self.owners.items()}

    @classmethod
    def from_pool(cls, pool: BlockPool, owners: Mapping[int, Hashable | Sequence[Hashable]] | None = None) -> PoolState:
        """From a ``BlockPool`` (its ``ref_cnt``, cached hashes and free queue) and ``owners``."""
        cached = [b.block_hash is not None for b in pool.blocks]
        ref_cnt, free_order = [b.ref_cnt for b in pool.blocks], [b.block_id for b in pool.free_queue]
        return cls(ref_cnt, cached, free_order, owner_lists(owners))

    @classmethod
    def from_tables(
        cls,
        tables: Mapping[K, Table],
        num_tokens: Mapping[K, int | None] | None = None,
        ref_cnt: Sequence[int] | None = None,
        cached: Sequence[bool] | None = None,
        labels: Labels = None,
    ) -> PoolState:
        """From ``key -> block ids``, and optionally ``key -> tokens``, per-block ``ref_cnt`` (default:
        how many tables hold the block) and ``cached``. ``labels`` names the owners: key -> label, or
        labels in key order (default: a string key is its own label, an int key ``k`` is ``seq k``)."""
        keys = list(tables)
        if labels is not None and not isinstance(labels, Mapping) and len(labels) < len(keys):
            raise ValueError(f"{len(labels)} labels for {len(keys)} block tables")
        named = labels if isinstance(labels, Mapping) or labels is None else dict(zip(keys, labels))
        names = [str((named or {}).get(k, k if isinstance(k, str) else f"seq {k}")) for k in keys]
        if len(set(names)) != len(names):
            raise ValueError(f"labels must be distinct, got {names}")
        ids: dict[Hashable, list[int]] = {n: [int(b) for b in _block_ids(tables[k])] for n, k in zip(names, keys)}
        given: Mapping[K, int | None] = num_tokens or {}
        tokens: dict[Hashable, int] = {n: -1 if (t := given.get(k)) is None else int(t) for n, k in zip(names, keys)}
        owners = owners_from_tables(ids)
        highest = max(owners, default=-1)
        refs = [int(r) for r in ref_cnt] if ref_cnt else [len(owners.get(b, [])) for b in range(highest + 1)]
        if highest >= len(refs):
            raise ValueError(f"block {highest} is outside the {len(refs)} blocks of ref_cnt")
        flags = ([bool(c) for c in cached or []] + [False] * len(refs))[: len(refs)]
        return cls(refs, flags, None, owners, ids, tokens)

    @classmethod
    def from_snapshot(cls, snapshot: StepSnapshot, labels: Labels = None) -> PoolState:
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


def owner_lists(owners: Mapping[int, Hashable | Sequence[Hashable]] | None) -> dict[int, list[Hashable]]:
    """block id -> its owners as a list (a lone owner, or a list or tuple of them)."""
    return {int(b): list(o) if isinstance(o, (list, tuple)) else [o] for b, o in (owners or {}).items()}


def _block_ids(table: Table) -> Sequence[int]:
    """A table's block ids: a ``BlockTable``'s (or any object's with ``block_ids``), or the table itself."""
    return table.block_ids if isinstance(table, BlockTable) else getattr(table, "block_ids", table)


def _fill(num_tokens: int, j: int, block_size: int) -> float:
    """The share of logical block ``j`` of a sequence of ``num_tokens`` tokens that holds tokens (-1: full)."""
    return 1.0 if num_tokens < 0 else min(block_size, max(0, num_tokens - j * block_size)) / block_size
