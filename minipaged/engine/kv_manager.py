"""Paged KV memory for the engine: which blocks each sequence owns (one of the two layouts
behind :class:`~minipaged.engine.kv_cache_manager.KVCacheManager`, the scheduler's one door).

Blocks only — no tensors are read or written here (the model runner does that, as each step's
``blocks_to_copy``, ``blocks_to_swap_out`` and ``blocks_to_swap_in`` say): a block pool, block
tables grown one block at a time, prefix caching, copy-on-write, and swapping to a host pool
(stages 1-2, 6 and the paper's §4.5). What a step changes in memory beyond the blocks a
sequence owns (the copies it owes, the blocks it fills for the prefix cache) is recorded in the
step's transaction (:class:`~minipaged.engine.step_transaction.StepTransaction`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from collections.abc import Sequence as Seq

from minipaged.engine.prefix_hit import PrefixHit
from minipaged.engine.sequence import Sequence
from minipaged.engine.step_transaction import StepTransaction
from minipaged.kv.block_pool import BlockPool, KVBlockPool, fork_blocks
from minipaged.kv.block_table import BlockTable
from minipaged.kv.kv_cache_block import KVCacheBlock
from minipaged.kv.prefix_cache import PrefixCache, PrefixIndex, chain_hashes, copy_on_write
from minipaged.utils import cdiv

AppendTokensFn = Callable[[BlockTable, int, KVBlockPool], list[int]]
BlockHashFn = Callable[[Seq[int], int, "list[int] | None", object], list[int]]
PrefixLookupFn = Callable[[PrefixIndex, Seq[int], Seq[int], int], list[KVCacheBlock]]
CopyOnWriteFn = Callable[[KVBlockPool, list[int], int], "tuple[int, int] | None"]
ForkFn = Callable[[KVBlockPool, list[int]], list[int]]


class PagedKVManager:
    """Blocks for sequences: prefix hits first, then one new block whenever the last one fills.

    With ``num_host_blocks`` a second pool in host memory takes preempted units' blocks (swap).
    The pool, the tables' growth, the block hashing, the prefix lookup, copy-on-write and fork are
    pieces a learner may swap (:mod:`minipaged.engine.plugins` hands them in; default: the package's).
    """

    can_fork = True

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        num_host_blocks: int = 0,
        *,
        block_pool: Callable[[int], KVBlockPool] = BlockPool,
        append_tokens: AppendTokensFn = BlockTable.append_tokens,
        block_hashes: BlockHashFn = chain_hashes,
        prefix_lookup: PrefixLookupFn = PrefixIndex.find,
        copy_on_write: CopyOnWriteFn = copy_on_write,
        fork: ForkFn = fork_blocks,
    ):
        self.block_size = self.table_block_size = block_size
        self.pool: KVBlockPool = block_pool(num_blocks)
        self.append_tokens: AppendTokensFn = append_tokens
        self.hash_blocks: BlockHashFn = block_hashes
        self.prefix_lookup: PrefixLookupFn = prefix_lookup
        self.copy_on_write: CopyOnWriteFn = copy_on_write
        self.fork_blocks: ForkFn = fork
        self.host_pool = BlockPool(num_host_blocks) if num_host_blocks else None
        self.prefix_cache = PrefixCache(self.pool) if enable_prefix_caching else None
        self.peak_slots_allocated = 0
        self.num_cow_copies = 0
        self.swapped_out_blocks = self.swapped_in_blocks = 0
        self._on_host: set[int] = set()  # seq_ids whose block tables name host blocks

    def block_ids(self, seq: Sequence, num_tokens: int) -> list[int]:
        return seq.block_table.block_ids[: cdiv(num_tokens, self.block_size)]

    def refuse(self, num_tokens: int, num_seqs: int) -> str | None:
        """Why ``num_seqs`` sequences of up to ``num_tokens`` tokens could never fit, or None."""
        need = num_seqs * cdiv(num_tokens - 1, self.block_size)  # the last sampled token is never stored
        if need > self.pool.num_blocks:
            return f"needs {need} blocks of {self.block_size} tokens but the whole pool has {self.pool.num_blocks}"
        return None

    # -- admission -------------------------------------------------------------------------
    def get_computed_blocks(self, seq: Sequence, tx: StepTransaction, scores_prompt: bool = False) -> PrefixHit:
        """Waiting ``seq``'s longest cached prefix, in the prefix cache and among the blocks this
        step fills (staged in ``tx``). Nothing changes: :meth:`hold` and :meth:`attach` take it.

        At least the last token is always left to compute, since its logits give the next token:
        a block holding the last token is never taken from the cache, so nothing shared is
        written again. A request that asks for ``prompt_logprobs`` (``scores_prompt``) takes no
        hit (vLLM's rule): its prompt needs every row's logits, and a cached block has only K/V.
        """
        if self.prefix_cache is None:
            return PrefixHit()
        hashes = self.hash_blocks(seq.token_ids, self.block_size, seq.block_hashes, None)
        if scores_prompt:
            return PrefixHit(hashes)  # its blocks are still hashed, and cached for the others
        usable = hashes[: (len(seq) - 1) // self.block_size]
        return PrefixHit(hashes, self.prefix_lookup(tx.prefix_index(), usable, seq.token_ids, self.block_size))

    def can_admit(self, unit: list[Sequence], hits: list[PrefixHit], plan: list[int]) -> bool:
        """Whether waiting ``unit`` fits once each member takes its hit: the blocks its tokens
        grow into, plus the hits that are free now (a cached free block leaves the free queue)."""
        bs = self.block_size
        grow = sum(cdiv(len(h.blocks) * bs + n, bs) - len(h.blocks) for h, n in zip(hits, plan) if n)
        revived = {b.block_id for h in hits for b in h.blocks if b.ref_cnt == 0}
        return grow + len(revived) <= self.pool.num_free_blocks

    def hold(self, hit: PrefixHit) -> None:
        """Take one reference to each block of ``hit`` (a free one leaves the free queue)."""
        if self.prefix_cache is not None:
            self.prefix_cache.take(hit.blocks)

    def release(self, hit: PrefixHit) -> None:
        """Give back what :meth:`hold` took (the sequence was not admitted after all)."""
        self.pool.free([b.block_id for b in hit.blocks])

    def attach(self, seq: Sequence, hit: PrefixHit) -> int:
        """``seq``'s block table starts with the held ``hit``; returns the tokens it holds."""
        seq.block_hashes = hit.block_hashes
        seq.block_table.add_blocks([b.block_id for b in hit.blocks], len(hit.blocks) * self.block_size)
        return len(hit.blocks) * self.block_size

    # -- growth ----------------------------------------------------------------------------
    def _tail(self, seq: Sequence) -> int | None:
        """Index of the block this step's first write lands in, if the table already has it."""
        idx = seq.num_computed_tokens // self.block_size
        return idx if idx < len(seq.block_table.block_ids) else None

    def _blocks_needed(self, unit: list[Sequence], plan: list[int], pool: KVBlockPool) -> int:
        """Blocks the unit's step takes from ``pool``: growth, plus a copy for each member that
        writes into a block it shares. Of ``k`` members sharing one block that nobody else holds,
        ``k - 1`` copy it; the last finds it its own."""
        grow, writers = 0, Counter[int]()
        for seq, n in zip(unit, plan):
            if n == 0:
                continue
            table = seq.block_table
            grow += max(table.num_blocks_needed(seq.num_computed_tokens + n) - len(table.block_ids), 0)
            idx = self._tail(seq)
            if idx is not None:
                writers[table.block_ids[idx]] += 1
        copies = sum(k if pool.blocks[b].ref_cnt > k else k - 1 for b, k in writers.items())
        return grow + copies

    def can_schedule(self, unit: list[Sequence], plan: list[int]) -> bool:
        return self._blocks_needed(unit, plan, self.pool) <= self.pool.num_free_blocks

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, tx: StepTransaction) -> None:
        """Room for ``num_new_tokens`` more tokens; a shared block is copied before it is written
        (the copy owed goes to ``tx.batch.blocks_to_copy``), and the blocks the step fills are staged."""
        table = seq.block_table
        idx = self._tail(seq)
        if idx is not None:
            copy = self.copy_on_write(self.pool, table.block_ids, idx)
            if copy is not None:
                tx.batch.blocks_to_copy.append(copy)
                self.num_cow_copies += 1
        self.append_tokens(table, max(seq.num_computed_tokens + num_new_tokens - table.num_tokens, 0), self.pool)
        self._stage(seq, seq.num_computed_tokens // self.block_size, table.num_tokens // self.block_size, tx)

    def _stage(self, seq: Sequence, first: int, end: int, tx: StepTransaction) -> None:
        """Offer blocks ``first .. end - 1`` of ``seq``, full once this step has run, to the prefix
        cache: staged in ``tx``, published when it commits (after the forward wrote their K/V)."""
        if self.prefix_cache is None or end <= first:
            return
        bs, table = self.block_size, seq.block_table.block_ids
        seq.block_hashes = self.hash_blocks(seq.token_ids[: end * bs], bs, seq.block_hashes[:first], None)
        for i in range(first, end):
            parent = self.pool.blocks[table[i - 1]] if i else None
            tx.stage(self.pool.blocks[table[i]], seq.block_hashes[i], seq.token_ids[i * bs : (i + 1) * bs], parent)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; False, and nothing changes, while any block is in use."""
        if self.prefix_cache is None:
            return self.pool.num_used_blocks == 0
        return self.prefix_cache.reset()

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (``ref_cnt + 1`` each)."""
        ids = self.fork_blocks(self.pool, list(parent.block_table.block_ids))
        child.block_table.add_blocks(ids, parent.block_table.num_tokens)
        child.block_hashes = list(parent.block_hashes)

    def free(self, seq: Sequence) -> None:
        on_host = seq.seq_id in self._on_host
        self._on_host.discard(seq.seq_id)
        seq.block_table.free(self.host_pool if on_host and self.host_pool else self.pool)

    # -- swapping --------------------------------------------------------------------------
    @staticmethod
    def _remap(unit: list[Sequence], src: KVBlockPool, dst: KVBlockPool) -> list[tuple[int, int]]:
        """Move the unit's blocks from ``src`` to ``dst``: one new block per distinct block, shared
        as it was shared within the unit. Returns the (src, dst) block pairs to copy."""
        moved: dict[int, int] = {}
        for seq in unit:
            for b in seq.block_table.block_ids:
                if b in moved:
                    dst.share(moved[b])
                else:
                    moved[b] = dst.allocate(1)[0].block_id
        for seq in unit:
            ids = seq.block_table.block_ids
            src.free(ids)
            seq.block_table.block_ids = [moved[b] for b in ids]
        return list(moved.items())

    def can_swap_out(self, unit: list[Sequence]) -> bool:
        distinct = {b for s in unit for b in s.block_table.block_ids}
        return self.host_pool is not None and len(distinct) <= self.host_pool.num_free_blocks

    def swap_out(self, unit: list[Sequence]) -> list[tuple[int, int]]:
        assert self.host_pool is not None
        pairs = self._remap(unit, self.pool, self.host_pool)
        self._on_host.update(s.seq_id for s in unit)
        self.swapped_out_blocks += len(pairs)
        return pairs

    def can_swap_in(self, unit: list[Sequence], plan: list[int]) -> bool:
        assert self.host_pool is not None
        distinct = len({b for s in unit for b in s.block_table.block_ids})
        return distinct + self._blocks_needed(unit, plan, self.host_pool) <= self.pool.num_free_blocks

    def swap_in(self, unit: list[Sequence]) -> list[tuple[int, int]]:
        assert self.host_pool is not None
        pairs = self._remap(unit, self.host_pool, self.pool)
        self._on_host.difference_update(s.seq_id for s in unit)
        self.swapped_in_blocks += len(pairs)
        return pairs

    # -- the step's outcome ----------------------------------------------------------------
    def mark_written(self) -> None:
        self.peak_slots_allocated = max(self.peak_slots_allocated, self.slots_allocated())

    # -- figures (on request, never per step) ----------------------------------------------
    def tokens_held(self, live: list[Sequence]) -> int:
        filled: dict[int, int] = {}
        for seq in live:
            n = seq.block_table.num_tokens
            for i, b in enumerate(seq.block_table.block_ids):
                filled[b] = max(filled.get(b, 0), min(self.block_size, n - i * self.block_size))
        return sum(filled.values())

    def slots_allocated(self) -> int:
        return self.pool.num_used_blocks * self.block_size

    def block_states(self) -> tuple[list[int], list[bool], int]:
        blocks = self.pool.blocks
        return [b.ref_cnt for b in blocks], [b.block_hash is not None for b in blocks], self.pool.num_free_blocks

    def stats(self) -> dict:
        return dict(
            num_free_blocks=self.pool.num_free_blocks,
            blocks_saved=sum(b.ref_cnt - 1 for b in self.pool.blocks if b.ref_cnt > 1),
            cached_blocks=len(self.prefix_cache) if self.prefix_cache is not None else 0,
            prefix_evictions=self.prefix_cache.num_evictions if self.prefix_cache is not None else 0,
            cow_copies=self.num_cow_copies,
            swapped_out_blocks=self.swapped_out_blocks,
            swapped_in_blocks=self.swapped_in_blocks,
        )
