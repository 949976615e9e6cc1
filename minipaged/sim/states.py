"""What a replayed memory system looks like after a step: copies that later steps do not change.

:func:`minipaged.sim.replay_steps` yields one after every step: a :class:`ContiguousState`
(stage 0's arena) or a :class:`PagedState` (stages 1-2's pool and block tables), for pictures of
the memory at a given step.
"""

from __future__ import annotations

from dataclasses import dataclass

from minipaged.kv.contiguous import FirstFitArena


@dataclass(frozen=True)
class ReplayState:
    """What a replayed memory system looks like after step ``step``. A copy: later steps do not change it.

    ``running`` in admission order, ``waiting`` head of the queue first (request ids);
    ``tokens`` maps each running request to the tokens it holds; ``finished`` and
    ``preemptions`` count since the start.
    """

    step: int
    running: tuple[int, ...]
    waiting: tuple[int, ...]
    tokens: dict[int, int]
    finished: int
    preemptions: int


@dataclass(frozen=True)
class ContiguousState(ReplayState):
    """Stage 0 after a step: ``arena`` is a copy of the slot arena (request id -> ``(start, size)``
    in ``arena.reservations()``); ``held_back`` says whether the head of the queue waits although
    the free slots add up to enough for it — it waits for a hole, not for memory."""

    arena: FirstFitArena
    held_back: bool


@dataclass(frozen=True)
class PagedState(ReplayState):
    """Stages 1-2 after a step: ``ref_cnt`` per block, ``free_order`` the free queue (front first,
    handed out next), ``block_tables`` request id -> its block ids in logical order."""

    block_size: int
    ref_cnt: tuple[int, ...]
    free_order: tuple[int, ...]
    block_tables: dict[int, tuple[int, ...]]

    @property
    def owners(self) -> dict[int, int]:
        """block id -> the request holding it (the replay never shares a block)."""
        return {block_id: rid for rid, table in self.block_tables.items() for block_id in table}
