"""KV memory for the engine: which slots each sequence may write this step.

Two managers with one interface, so the same scheduler runs on either:

- :class:`PagedKVManager`: a block pool, block tables grown one block at a time, prefix
  caching and copy-on-write (stages 1-3 and 6);
- :class:`ContiguousKVManager`: stage 0's reservation of ``max_model_len`` slots per sequence,
  kept to compare the two on the same memory budget.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from minipaged.attention.backend import PagedBackend, PagedMetadata
from minipaged.engine.sequence import Sequence
from minipaged.kv.allocator import BlockPool
from minipaged.kv.block_table import padded_block_tables
from minipaged.kv.contiguous import ContiguousBackend, ContiguousKVCache
from minipaged.kv.prefix_cache import PrefixCache, chain_hashes
from minipaged.kv.slot_mapping import PagedKVCache, build_slot_mapping


def _cu_seqlens(q_lens: Seq[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *q_lens], device=device).cumsum(0).to(torch.int32)


class PagedKVManager:
    """Blocks for sequences: prefix hits first, then one new block whenever the last one fills."""

    def __init__(self, kv: PagedKVCache, enable_prefix_caching: bool, attention_backend: str) -> None:
        self.kv = kv
        self.block_size = kv.block_size
        self.pool = BlockPool(kv.num_blocks)
        self.prefix_cache = PrefixCache(self.pool) if enable_prefix_caching else None
        self.backend = PagedBackend(kv, attention_backend)
        self.hit_tokens = 0
        self.num_cow_copies = 0

    # -- admission -------------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> int:
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

    def undo_match(self, seq: Sequence) -> None:
        """Give back the hits of a sequence that could not be admitted after all."""
        self.free(seq)

    # -- growth ----------------------------------------------------------------------------
    def _shared_tail(self, seq: Sequence) -> int | None:
        """Index of the block that this step's first write lands in, if other sequences share it."""
        idx = seq.num_computed_tokens // self.block_size
        table = seq.block_table.block_ids
        if idx < len(table) and self.pool.blocks[table[idx]].ref_cnt > 1:
            return idx
        return None

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        grow = seq.block_table.num_blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(
            seq.block_table.block_ids
        )
        return grow + (self._shared_tail(seq) is not None)

    def can_schedule(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.pool.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Room for ``num_new_tokens`` more tokens; copy a shared tail block before writing it."""
        idx = self._shared_tail(seq)
        if idx is not None:  # copy-on-write: this sequence gets its own copy of the shared block
            old = seq.block_table.block_ids[idx]
            new = self.pool.allocate(1)[0].block_id
            self.kv.copy_block(old, new)
            self.pool.free([old])
            seq.block_table.block_ids[idx] = new
            self.num_cow_copies += 1
        table = seq.block_table
        table.append_tokens(seq.num_computed_tokens + num_new_tokens - table.num_tokens, self.pool)
        self._publish(seq, seq.num_computed_tokens // self.block_size, table.num_tokens // self.block_size)

    def _publish(self, seq: Sequence, first: int, end: int) -> None:
        """Offer blocks ``first .. end - 1`` of ``seq``, full once this step has run, to the prefix cache.

        They are published before the step computes them, so a request admitted later in the same
        step can share them: every attention layer writes the whole batch's K/V before any query
        reads, so the reader finds them in place.
        """
        if self.prefix_cache is None or end <= first:
            return
        bs = self.block_size
        seq.block_hashes = chain_hashes(seq.token_ids[: end * bs], bs, seq.block_hashes[:first])
        for i in range(first, end):
            block = self.pool.blocks[seq.block_table.block_ids[i]]
            self.prefix_cache.insert(block, seq.block_hashes[i], seq.token_ids[i * bs : (i + 1) * bs])

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (``ref_cnt + 1`` each)."""
        for block_id in parent.block_table.block_ids:
            self.pool.share(block_id)
        child.block_table.add_blocks(parent.block_table.block_ids, parent.block_table.num_tokens)

    def free(self, seq: Sequence) -> None:
        seq.block_table.free(self.pool)

    # -- one step's metadata ---------------------------------------------------------------
    def prepare(self, seqs: list[Sequence], q_lens: list[int]) -> None:
        """Tell the attention layers where this step's tokens go and what they read."""
        dev = self.kv.k.device
        starts = [s.num_computed_tokens for s in seqs]
        ends = [a + n for a, n in zip(starts, q_lens)]
        tables = [s.block_table.block_ids for s in seqs]
        self.backend.set_batch(
            PagedMetadata(
                slot_mapping=build_slot_mapping(tables, starts, ends, self.block_size, dev),
                block_tables=padded_block_tables(tables, device=dev),
                context_lens=torch.tensor(ends, dtype=torch.int32, device=dev),
                cu_seqlens_q=_cu_seqlens(q_lens, dev),
            )
        )

    # -- figures ---------------------------------------------------------------------------
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


class ContiguousKVManager:
    """Stage 0 inside the engine: each admitted sequence reserves ``max_model_len`` slots."""

    prefix_cache = None

    def __init__(self, cache: ContiguousKVCache) -> None:
        self.cache = cache
        self.backend = ContiguousBackend(cache)
        self.hit_tokens = 0
        self.num_cow_copies = 0

    def match_prefix(self, seq: Sequence) -> int:
        return 0

    def undo_match(self, seq: Sequence) -> None:
        pass

    def can_schedule(self, seq: Sequence, num_new_tokens: int) -> bool:
        return seq.seq_id in self.cache.reservations() or self.cache.can_reserve()

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        if seq.seq_id not in self.cache.reservations():
            self.cache.add_sequence(seq.seq_id)

    def free(self, seq: Sequence) -> None:
        if seq.seq_id in self.cache.reservations():
            self.cache.remove_sequence(seq.seq_id)

    def prepare(self, seqs: list[Sequence], q_lens: list[int]) -> None:
        ends = [s.num_computed_tokens + n for s, n in zip(seqs, q_lens)]
        self.backend.set_batch([s.seq_id for s in seqs], q_lens, ends)

    def tokens_held(self, live: list[Sequence]) -> int:
        return self.cache.stats().used_slots

    def slots_allocated(self) -> int:
        return self.cache.stats().reserved_slots
