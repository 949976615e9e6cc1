"""Stage 0 inside the engine: each admitted sequence reserves one contiguous run of slots.

This is how serving systems before PagedAttention held KV memory, and the paper's baselines
(Orca, §6) differ only in how much they reserve, ``contiguous_reserve``:

- ``"max"`` (Orca (Max)): ``max_model_len`` slots, whatever the request;
- ``"pow2"`` (Orca (Pow2)): the next power of two of prompt + ``max_tokens``;
- ``"oracle"`` (Orca (Oracle)): exactly prompt + ``max_tokens``, as if the length were known.

The reservations live in stage 0's first-fit arena of ``num_slots`` slots; the cache tensors are
a paged pool of one-slot blocks, so a sequence's block table is its reservation read by
:meth:`~minipaged.kv.contiguous.FirstFitArena.table`, ``range(start, start + n)`` (as in the
static runner of stage 0), and the same attention reads both layouts. Behind the scheduler's
one door (:class:`~minipaged.engine.kv_cache_manager.KVCacheManager`) it answers the paged verbs
as a layout that shares nothing must: no computed blocks (a prefix hit is empty), nothing to
hold, no host memory to swap to (a preempted sequence is recomputed), and no fork
(``can_fork = False``: requests that would fork are refused when they arrive).
"""

from __future__ import annotations

from minipaged.engine.config import RESERVE_POLICIES
from minipaged.engine.prefix_hit import PrefixHit
from minipaged.engine.sequence import Sequence
from minipaged.engine.step_transaction import StepTransaction
from minipaged.kv.contiguous import FirstFitArena
from minipaged.kv.prefix_cache import PrefixCache


def reservation(num_tokens: int, max_model_len: int, policy: str) -> int:
    """Slots a sequence of at most ``num_tokens`` tokens (prompt + ``max_tokens``) reserves."""
    if policy == "max":
        return max_model_len
    if policy == "pow2":
        return min(1 << max(num_tokens - 1, 0).bit_length(), max_model_len)
    return num_tokens


class ContiguousKVManager:
    can_fork = False
    table_block_size = 1
    prefix_cache: PrefixCache | None = None  # nothing is cached

    def __init__(self, num_slots: int, block_size: int, max_model_len: int, policy: str = "max") -> None:
        if policy not in RESERVE_POLICIES:
            raise ValueError(f"contiguous_reserve must be one of {RESERVE_POLICIES}, got {policy!r}")
        self.arena = FirstFitArena(num_slots)
        self.block_size = block_size  # only to report free memory in blocks, like the paged pool
        self.max_model_len = max_model_len
        self.policy = policy
        self.peak_slots_allocated = 0

    def size_of(self, seq: Sequence) -> int:
        return reservation(seq.num_prompt_tokens + seq.params.max_tokens, self.max_model_len, self.policy)

    def block_ids(self, seq: Sequence, num_tokens: int) -> range:
        return self.arena.table(seq.seq_id, num_tokens)

    def refuse(self, num_tokens: int, num_seqs: int) -> str | None:
        """Why a sequence of up to ``num_tokens`` tokens could never fit, or None."""
        size = reservation(num_tokens, self.max_model_len, self.policy)
        if size > self.arena.num_slots:
            return f"reserves {size} slots ({self.policy}) but the cache has {self.arena.num_slots}"
        return None

    def can_schedule(self, unit: list[Sequence], plan: list[int]) -> bool:
        new = [s for s in unit if s.seq_id not in self.arena]
        return not new or (len(new) == 1 and self.arena.largest_hole >= self.size_of(new[0]))

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, tx: StepTransaction) -> None:
        """A new sequence's one reservation, whole (nothing to copy, nothing to publish)."""
        if seq.seq_id not in self.arena:
            self.arena.reserve(seq.seq_id, self.size_of(seq))

    # -- the paged verbs, as a layout that shares nothing answers them ---------------------
    def get_computed_blocks(self, seq: Sequence, tx: StepTransaction, scores_prompt: bool = False) -> PrefixHit:
        return PrefixHit()  # nothing is cached

    def can_admit(self, unit: list[Sequence], hits: list[PrefixHit], plan: list[int]) -> bool:
        return self.can_schedule(unit, plan)

    def hold(self, hit: PrefixHit) -> None:
        return None

    def release(self, hit: PrefixHit) -> None:
        return None

    def attach(self, seq: Sequence, hit: PrefixHit) -> int:
        return 0

    def fork(self, parent: Sequence, child: Sequence) -> None:
        raise RuntimeError("forking shares blocks: it needs kv_layout='paged'")

    def can_swap_out(self, unit: list[Sequence]) -> bool:
        return False  # no host memory: a preempted sequence is recomputed

    def swap_out(self, unit: list[Sequence]) -> list[tuple[int, int]]:
        raise RuntimeError("swapping needs kv_layout='paged'")

    def can_swap_in(self, unit: list[Sequence], plan: list[int]) -> bool:
        return False

    def swap_in(self, unit: list[Sequence]) -> list[tuple[int, int]]:
        raise RuntimeError("swapping needs kv_layout='paged'")

    def reset_prefix_cache(self) -> bool:
        return self.slots_allocated() == 0

    def block_states(self) -> tuple[list[int], list[bool], int]:
        return [], [], 0  # no blocks to draw (its free memory is in stats(), as slots // block_size)

    def free(self, seq: Sequence) -> None:
        if seq.seq_id in self.arena:
            self.arena.free(seq.seq_id)

    def mark_written(self) -> None:
        self.peak_slots_allocated = max(self.peak_slots_allocated, self.slots_allocated())

    def tokens_held(self, live: list[Sequence]) -> int:
        return sum(s.num_computed_tokens for s in live if s.seq_id in self.arena)

    def slots_allocated(self) -> int:
        return self.arena.num_slots - self.arena.free_slots

    def stats(self) -> dict:
        return dict(num_free_blocks=self.arena.free_slots // self.block_size, swapped_out_blocks=0, swapped_in_blocks=0)
