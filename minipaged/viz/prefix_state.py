"""The data behind the stage 6 pictures: who holds which block, what is shared, what sharing saves.

A :class:`PrefixState` is one moment of a paged pool in plain form, built from an engine
``StepSnapshot`` (:meth:`PrefixState.from_snapshot`) or from block tables
(:meth:`PrefixState.from_tables`). It counts each block's users once (:attr:`PrefixState.users`);
the pictures (:mod:`minipaged.viz.prefix`), :func:`sharing_summary` and :func:`copies_between`
all read that count.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

Labels = Mapping[Hashable, str] | Sequence[str] | None


@dataclass
class PrefixState:
    """Sequences' block tables (label -> physical block ids) and token counts (-1: unknown, drawn
    full), with ``ref_cnt`` and ``cached`` per physical block; ``keys`` maps a label back to the
    caller's key (a ``seq_id``), to match sequences across frames. Without ``ref_cnt`` (empty),
    a block's ref count is the number of tables that hold it."""

    tables: dict[str, list[int]]
    num_tokens: dict[str, int]
    ref_cnt: list[int] = field(default_factory=list)
    cached: list[bool] = field(default_factory=list)
    keys: dict[str, Hashable] = field(default_factory=dict)
    users: dict[int, int] = field(init=False)  # physical block -> how many of the tables hold it

    def __post_init__(self) -> None:
        self.users = {}
        for table in self.tables.values():
            for b in set(table):
                self.users[b] = self.users.get(b, 0) + 1
        highest = max(self.users, default=-1)
        if not self.ref_cnt:
            self.ref_cnt = [self.users.get(b, 0) for b in range(highest + 1)]
        elif highest >= len(self.ref_cnt):
            raise ValueError(f"block {highest} is outside the {len(self.ref_cnt)} blocks of ref_cnt")
        self.cached = (list(self.cached) + [False] * len(self.ref_cnt))[: len(self.ref_cnt)]

    @classmethod
    def from_tables(
        cls,
        block_tables: Mapping[Hashable, Sequence[int]],
        num_tokens: Mapping[Hashable, int] | None = None,
        ref_cnt: Sequence[int] | None = None,
        cached: Sequence[bool] | None = None,
        labels: Labels = None,
    ) -> PrefixState:
        """From ``key -> block ids`` (lists or ``BlockTable``s) and, optionally, ``key -> tokens``,
        per-block ``ref_cnt`` and ``cached``. ``labels``: key -> label, or labels in table order
        (default: a string key is its own label, an int key ``k`` is ``seq k``)."""
        keys = list(block_tables)
        names = _labels_for(keys, labels)
        if len(set(names)) != len(names):
            raise ValueError(f"labels must be distinct, got {names}")
        tables = {
            n: [int(b) for b in getattr(block_tables[k], "block_ids", block_tables[k])] for n, k in zip(names, keys)
        }
        given = num_tokens or {}
        tokens = {n: int(given[k]) if given.get(k) is not None else -1 for n, k in zip(names, keys)}
        return cls(
            tables, tokens, [int(r) for r in ref_cnt or []], [bool(c) for c in cached or []], dict(zip(names, keys))
        )

    @classmethod
    def from_snapshot(cls, snapshot, labels: Labels = None) -> PrefixState:
        """From an engine ``StepSnapshot`` (its block tables, token counts, ``ref_cnt``, ``cached``)."""
        return cls.from_tables(snapshot.block_tables, snapshot.num_tokens, snapshot.ref_cnt, snapshot.cached, labels)

    def shared_blocks(self) -> set[int]:
        """Blocks with ``ref_cnt > 1`` or in more than one table."""
        return {b for b, n in self.users.items() if n > 1} | {b for b, r in enumerate(self.ref_cnt) if r > 1}

    def fill(self, name: str, j: int, block_size: int) -> float:
        """The share of logical block ``j`` of sequence ``name`` that holds tokens (1 when unknown)."""
        n = self.num_tokens[name]
        return 1.0 if n < 0 else min(block_size, max(0, n - j * block_size)) / block_size

    def block_fill(self, block_size: int) -> dict[int, float]:
        """Physical block -> the share of its slots that hold tokens (the fullest holder's view)."""
        out: dict[int, float] = {}
        for name, table in self.tables.items():
            for j, b in enumerate(table):
                out[b] = max(out.get(b, 0.0), self.fill(name, j, block_size))
        return out

    def owner(self, block: int) -> str | None:
        """The first sequence whose table holds ``block`` (None: no table drawn holds it)."""
        return next((name for name, t in self.tables.items() if block in t), None)


def _labels_for(keys: list[Hashable], labels: Labels) -> list[str]:
    if labels is None:
        return [k if isinstance(k, str) else f"seq {k}" for k in keys]
    if isinstance(labels, Mapping):
        return [str(labels.get(k, k if isinstance(k, str) else f"seq {k}")) for k in keys]
    labels = list(labels)
    if len(labels) < len(keys):
        raise ValueError(f"{len(labels)} labels for {len(keys)} block tables")
    return [str(x) for x in labels[: len(keys)]]


def as_state(state, labels: Labels = None) -> PrefixState:
    """A :class:`PrefixState` from a ``StepSnapshot``-like object or a ``(block_tables, num_tokens,
    ref_cnt, cached)`` tuple (trailing items may be left out). ``labels``: key -> label, or
    labels in table order."""
    if isinstance(state, PrefixState):
        return state
    if hasattr(state, "block_tables"):
        return PrefixState.from_snapshot(state, labels)
    tables, num_tokens, ref_cnt, cached = (tuple(state) + (None, None, None))[:4]
    return PrefixState.from_tables(tables, num_tokens, ref_cnt, cached, labels)


def sharing_summary(state, block_size: int | None = None) -> dict:
    """Numbers behind the pictures, from the block tables alone (``state`` as in :func:`as_state`).

    ``blocks_in_use``: distinct blocks the tables hold; ``blocks_without_sharing``: what they would
    hold if no block were shared (the sum of the tables' lengths); ``blocks_saved`` = the
    difference; ``saved_fraction`` = saved / without; ``shared_blocks``: blocks in more than one
    table; ``max_ref_cnt``: the most tables holding one block; ``tokens_shared``: the shared
    blocks' slots (``block_size`` each) when ``block_size`` is given.
    """
    st = as_state(state)
    in_use = len(st.users)
    without = sum(len(t) for t in st.tables.values())
    shared = sorted(b for b, n in st.users.items() if n > 1)
    out = dict(
        num_tables=len(st.tables),
        blocks_in_use=in_use,
        blocks_without_sharing=without,
        blocks_saved=without - in_use,
        saved_fraction=(without - in_use) / without if without else 0.0,
        shared_blocks=shared,
        max_ref_cnt=max(st.users.values(), default=0),
    )
    if block_size is not None:
        out["tokens_shared"] = len(shared) * block_size
    return out


def copies_between(before: PrefixState, after: PrefixState) -> list[tuple[str, int, int, int]]:
    """(sequence label, logical block, old block, new block) for every block copy-on-write replaced.

    A copy is a table entry that changed from a block shared in ``before`` (``ref_cnt > 1``) to
    another block, while the table kept its length or grew.
    """
    out = []
    for name, new in after.tables.items():
        old = before.tables.get(name)
        if old is None:
            continue
        for j, (a, b) in enumerate(zip(old, new)):
            if a != b and before.ref_cnt[a] > 1:
                out.append((name, j, a, b))
    return out
