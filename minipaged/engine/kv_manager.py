"""KV memory for the engine: which slots each sequence owns. Blocks only — no tensors are read
or written here, and no attention metadata is built (that is the model runner's job).

Two managers implement one interface, :class:`KVManager`, so the same scheduler runs on either:

- :class:`PagedKVManager`: a block pool, block tables grown one block at a time, prefix
  caching and copy-on-write (stages 1-2 and 6);
- :class:`ContiguousKVManager`: stage 0's reservation of ``max_model_len`` slots per sequence,
  kept to compare the two on the same memory budget.
"""

from __future__ import annotations

from typing import Protocol

from minipaged.engine.sequence import Sequence
from minipaged.kv.block_pool import BlockPool, KVCacheBlock
from minipaged.kv.contiguous import ContiguousKVCache
from minipaged.kv.prefix_cache import PrefixCache, chain_hashes


class KVManager(Protocol):
    """What the scheduler asks of KV memory. ``copies``: the (src, dst) block copies that
    copy-on-write decided this step and that the model runner carries out before the forward;
    ``peak_slots_allocated``: the most slots ever allocated at the end of a step."""

    copies: list[tuple[int, int]]
    peak_slots_allocated: int

    def admit(self, seq: Sequence, token_budget: int) -> int:
        """Take a waiting sequence in: share its cached prefix, then make room for up to
        ``token_budget`` of its remaining tokens. Returns the tokens scheduled (0 = not admitted,
        and nothing changed)."""
        ...

    def can_schedule(self, seq: Sequence, num_new_tokens: int) -> bool: ...

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None: ...

    def fork(self, parent: Sequence, child: Sequence) -> None: ...

    def free(self, seq: Sequence) -> None: ...

    def mark_written(self) -> None:
        """The step ran: every slot handed out for it now holds K/V (and the peak is updated)."""
        ...

    def drop_unwritten(self) -> None:
        """The step failed before its K/V were written: forget what it published to the cache."""
        ...

    def slots_allocated(self) -> int: ...

    def tokens_held(self, live: list[Sequence]) -> int: ...

    def stats(self) -> dict: ...


class PagedKVManager:
    """Blocks for sequences: prefix hits first, then one new block whenever the last one fills."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.prefix_cache = PrefixCache(self.pool) if enable_prefix_caching else None
        self.copies: list[tuple[int, int]] = []  # (src, dst) block copies the runner owes this step
        self.peak_slots_allocated = 0
        self.hit_tokens = 0
        self.num_cow_copies = 0
        self._unwritten: list[KVCacheBlock] = []  # published this step, K/V not computed yet

    # -- admission -------------------------------------------------------------------------
    def admit(self, seq: Sequence, token_budget: int) -> int:
        hit = self._match_prefix(seq)
        n = min(len(seq) - seq.num_computed_tokens, token_budget)
        if not self.can_schedule(seq, n):
            self.free(seq)
            seq.num_computed_tokens = seq.num_cached_tokens = 0
            return 0
        self.allocate(seq, n)
        self.hit_tokens += hit
        return n

    def _match_prefix(self, seq: Sequence) -> int:
        """Share the cached blocks of ``seq``'s longest cached prefix; returns the tokens hit.

        At least the last token is always left to compute, since its logits give the next token:
        a block holding the last token is never taken from the cache, so nothing shared is
        written again.
        """
        if self.prefix_cache is None or seq.num_computed_tokens:
            return 0
        seq.block_hashes = chain_hashes(seq.token_ids, self.block_size, seq.block_hashes)
        usable = (len(seq) - 1) // self.block_size
        hits = self.prefix_cache.lookup(seq.block_hashes[:usable], seq.token_ids, self.block_size)
        seq.block_table.add_blocks([b.block_id for b in hits], len(hits) * self.block_size)
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        return seq.num_computed_tokens

    # -- growth ----------------------------------------------------------------------------
    def _shared_tail(self, seq: Sequence) -> int | None:
        """Index of the block that this step's first write lands in, if other sequences share it."""
        idx = seq.num_computed_tokens // self.block_size
        table = seq.block_table.block_ids
        if idx < len(table) and self.pool.blocks[table[idx]].ref_cnt > 1:
            return idx
        return None

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        table = seq.block_table
        grow = table.num_blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(table.block_ids)
        return max(grow, 0) + (self._shared_tail(seq) is not None)

    def can_schedule(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.pool.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Room for ``num_new_tokens`` more tokens; copy a shared tail block before writing it."""
        idx = self._shared_tail(seq)
        if idx is not None:  # copy-on-write: this sequence gets its own copy of the shared block
            old = seq.block_table.block_ids[idx]
            new = self.pool.allocate(1)[0].block_id
            self.copies.append((old, new))  # the runner copies the K/V before the step writes
            self.pool.free([old])
            seq.block_table.block_ids[idx] = new
            self.num_cow_copies += 1
        table = seq.block_table
        table.append_tokens(max(seq.num_computed_tokens + num_new_tokens - table.num_tokens, 0), self.pool)
        self._publish(seq, seq.num_computed_tokens // self.block_size, table.num_tokens // self.block_size)

    def _publish(self, seq: Sequence, first: int, end: int) -> None:
        """Offer blocks ``first .. end - 1`` of ``seq``, full once this step has run, to the prefix cache.

        They are published before the step computes them, so a request admitted later in the same
        step can share them: every attention layer writes the whole batch's K/V before any query
        reads, so the reader finds them in place.
        """
        if self.prefix_cache is None or end <= first:
            return
        bs, table = self.block_size, seq.block_table.block_ids
        seq.block_hashes = chain_hashes(seq.token_ids[: end * bs], bs, seq.block_hashes[:first])
        for i in range(first, end):
            block = self.pool.blocks[table[i]]
            parent = self.pool.blocks[table[i - 1]] if i else None
            if self.prefix_cache.insert(block, seq.block_hashes[i], seq.token_ids[i * bs : (i + 1) * bs], parent):
                self._unwritten.append(block)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (``ref_cnt + 1`` each)."""
        for block_id in parent.block_table.block_ids:
            self.pool.share(block_id)
        child.block_table.add_blocks(parent.block_table.block_ids, parent.block_table.num_tokens)

    def free(self, seq: Sequence) -> None:
        seq.block_table.free(self.pool)

    # -- the step's outcome ----------------------------------------------------------------
    def mark_written(self) -> None:
        self._unwritten.clear()
        self.copies.clear()
        self.peak_slots_allocated = max(self.peak_slots_allocated, self.slots_allocated())

    def drop_unwritten(self) -> None:
        # The copy-on-write copies stay owed: a retried step still needs them.
        if self.prefix_cache is not None:
            for block in self._unwritten:
                self.prefix_cache.discard(block)
        self._unwritten.clear()

    # -- figures (on request, never per step) ----------------------------------------------
    def tokens_held(self, live: list[Sequence]) -> int:
        """Slots holding a live token; a slot shared by several sequences counts once."""
        filled: dict[int, int] = {}
        for seq in live:
            n = seq.block_table.num_tokens
            for i, b in enumerate(seq.block_table.block_ids):
                filled[b] = max(filled.get(b, 0), min(self.block_size, n - i * self.block_size))
        return sum(filled.values())

    def slots_allocated(self) -> int:
        return self.pool.num_used_blocks * self.block_size

    def stats(self) -> dict:
        return dict(
            num_free_blocks=self.pool.num_free_blocks,
            prefix_hit_tokens=self.hit_tokens,
            blocks_saved=sum(b.ref_cnt - 1 for b in self.pool.blocks if b.ref_cnt > 1),
            cached_blocks=len(self.prefix_cache) if self.prefix_cache is not None else 0,
            cow_copies=self.num_cow_copies,
        )


class ContiguousKVManager:
    """Stage 0 inside the engine: each admitted sequence reserves ``max_model_len`` slots.

    The reservations live in the stage-0 cache's first-fit arena; nothing is shared, so the
    prefix-cache and copy-on-write parts of the interface have nothing to do.
    """

    def __init__(self, cache: ContiguousKVCache, block_size: int) -> None:
        self.cache = cache
        self.block_size = block_size  # only to report free memory in blocks, like the paged pool
        self.copies: list[tuple[int, int]] = []  # always empty: nothing is shared, nothing copied
        self.peak_slots_allocated = 0

    def admit(self, seq: Sequence, token_budget: int) -> int:
        if not self.cache.can_reserve():
            return 0
        self.cache.add_sequence(seq.seq_id)
        return min(len(seq) - seq.num_computed_tokens, token_budget)

    def can_schedule(self, seq: Sequence, num_new_tokens: int) -> bool:
        return seq.seq_id in self.cache.num_tokens or self.cache.can_reserve()

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        if seq.seq_id not in self.cache.num_tokens:
            self.cache.add_sequence(seq.seq_id)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        raise NotImplementedError("a contiguous cache cannot share: each sample is its own sequence from the start")

    def free(self, seq: Sequence) -> None:
        if seq.seq_id in self.cache.num_tokens:
            self.cache.remove_sequence(seq.seq_id)

    def mark_written(self) -> None:
        self.peak_slots_allocated = max(self.peak_slots_allocated, self.slots_allocated())

    def drop_unwritten(self) -> None:
        pass

    def tokens_held(self, live: list[Sequence]) -> int:
        return self.cache.stats().used_slots

    def slots_allocated(self) -> int:
        return self.cache.stats().reserved_slots

    def stats(self) -> dict:
        return dict(num_free_blocks=self.cache.arena.free_slots // self.block_size)
