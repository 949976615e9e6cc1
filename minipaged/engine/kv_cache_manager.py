"""The one door to KV memory: what the scheduler asks of it, whatever the layout (vLLM V1's
``KVCacheManager``, with this engine's extras).

The scheduler holds one :class:`KVCacheManager` and never asks which layout is behind it. Two
implement it: :class:`~minipaged.engine.kv_manager.PagedKVManager` (blocks, prefix caching,
copy-on-write, swapping) and :class:`~minipaged.engine.contiguous_manager.ContiguousKVManager`
(stage 0's one reservation per sequence), which answers the paged verbs the way a layout that
shares nothing must: no computed blocks, nothing to hold, no room to swap. The verbs:

- admission: ``get_computed_blocks`` (a waiting sequence's prefix hit, nothing changed),
  ``can_admit``, then ``hold`` / ``release`` / ``attach`` to take the hit or give it back;
- growth: ``can_schedule``, ``allocate_slots`` (copies owed and blocks filled go to the step's
  transaction), ``block_ids`` (what a row of the step reads and writes);
- the extras: ``fork`` (a child shares its parent's blocks), ``can_swap_out`` / ``swap_out`` /
  ``can_swap_in`` / ``swap_in`` (host memory), ``reset_prefix_cache``;
- the end of a sequence: ``free``; of a step: ``mark_written``;
- figures read on request: ``tokens_held``, ``slots_allocated``, ``peak_slots_allocated``,
  ``stats`` and ``summary`` (the pool block by block).

A *unit* is the sequences that are scheduled, preempted and swapped together (their request
group says which); ``plan`` gives each member's new tokens this step.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

from minipaged.engine.prefix_hit import PrefixHit
from minipaged.engine.sequence import Sequence
from minipaged.engine.step_transaction import StepTransaction
from minipaged.kv.prefix_cache import PrefixCache


class KVCacheManager(Protocol):
    """What the scheduler asks of memory (the module docstring)."""

    can_fork: bool  # whether sequences can share blocks (samples fork, beams branch)
    table_block_size: int  # slots per entry of the tables that ``block_ids`` returns
    prefix_cache: PrefixCache | None  # where the step's filled blocks are published (None: no caching)
    peak_slots_allocated: int

    def refuse(self, num_tokens: int, num_seqs: int) -> str | None:
        """Why ``num_seqs`` sequences of up to ``num_tokens`` tokens could never fit, or None."""
        ...

    # -- admission -------------------------------------------------------------------------
    def get_computed_blocks(self, seq: Sequence, tx: StepTransaction, scores_prompt: bool) -> PrefixHit:
        """Waiting ``seq``'s cached prefix (``scores_prompt``: its request wants every prompt row's logits)."""
        ...

    def can_admit(self, unit: list[Sequence], hits: list[PrefixHit], plan: list[int]) -> bool: ...

    def hold(self, hit: PrefixHit) -> None: ...

    def release(self, hit: PrefixHit) -> None: ...

    def attach(self, seq: Sequence, hit: PrefixHit) -> int:
        """``seq``'s table starts with the held ``hit``; returns the tokens it holds."""
        ...

    # -- growth ----------------------------------------------------------------------------
    def can_schedule(self, unit: list[Sequence], plan: list[int]) -> bool: ...

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, tx: StepTransaction) -> None:
        """Room for the step's new tokens; the copies owed before the forward go to ``tx``."""
        ...

    def block_ids(self, seq: Sequence, num_tokens: int) -> Seq[int]:
        """Where ``seq``'s first ``num_tokens`` tokens live, one entry per ``table_block_size``
        slots: a new sequence, not a view of the sequence's own table."""
        ...

    # -- sharing and swapping --------------------------------------------------------------
    def fork(self, parent: Sequence, child: Sequence) -> None: ...

    def can_swap_out(self, unit: list[Sequence]) -> bool: ...

    def swap_out(self, unit: list[Sequence]) -> list[tuple[int, int]]: ...

    def can_swap_in(self, unit: list[Sequence], plan: list[int]) -> bool: ...

    def swap_in(self, unit: list[Sequence]) -> list[tuple[int, int]]: ...

    def reset_prefix_cache(self) -> bool: ...

    # -- the end of a sequence, of a step --------------------------------------------------
    def free(self, seq: Sequence) -> None: ...

    def mark_written(self) -> None:
        """The step ran: every slot handed out for it holds K/V now (the peak is updated)."""
        ...

    # -- figures (on request, never per step) ----------------------------------------------
    def tokens_held(self, live: list[Sequence]) -> int:
        """Slots holding a live token; a slot shared by several sequences counts once."""
        ...

    def slots_allocated(self) -> int: ...

    def stats(self) -> dict: ...

    def block_states(self) -> tuple[list[int], list[bool], int]:
        """Every block's ``ref_cnt``, whether it is cached, and the free block count (empty lists
        for a layout without blocks)."""
        ...
