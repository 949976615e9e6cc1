"""How each of your pieces meets the engine: one adapter per plug-in point of ``EnginePlugins``.

``python -m exercises engine`` (:mod:`exercises.engine`) fills the engine's plug-in points with
these. Each adapter calls your function with the arguments your stage's exercise defines,
turns its answer into what the engine expects, and counts its calls in ``calls[stage]`` and
``calls[stage, what]`` (the kind of call or of step), so the report can say what your code did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, MutableSequence
from collections.abc import Sequence as SequenceOf  # Sequence is the engine's
from types import ModuleType
from typing import Any, Protocol

import torch

from exercises.launchers import paged_decode_attention as launch_decode
from exercises.stage4_triton import store_kvcache as launch_store
from minipaged.attention import reference
from minipaged.attention.batched import BatchPlan, TorchBackend
from minipaged.attention.cache_attention import PagedMetadata
from minipaged.engine.batch import ScheduledBatch
from minipaged.engine.kv_manager import PagedKVManager
from minipaged.engine.scheduler import Scheduler
from minipaged.engine.sequence import Sequence
from minipaged.kv.block_pool import KVBlockPool
from minipaged.kv.cached_blocks import CachedBlocks
from minipaged.kv.kv_cache_block import KVCacheBlock
from minipaged.kv.prefix_cache import PrefixIndex


class Stage1Pool(Protocol):
    """What the engine reads of your stage 1 pool (``TinyPool``'s names)."""

    free_list: MutableSequence[int]
    ref_cnt: list[int]

    def allocate(self, n: int) -> list[int]: ...
    def free(self, ids: list[int]) -> None: ...
    def share(self, block_id: int) -> None: ...


class _BlockView(KVCacheBlock):
    """A block of a learner's pool as the engine reads it: ``ref_cnt`` is the learner's count."""

    def __init__(self, pool: Stage1Pool, block_id: int) -> None:
        super().__init__(block_id)
        self._pool = pool

    @property
    def ref_cnt(self) -> int:
        return self._pool.ref_cnt[self.block_id]

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        pass  # the learner's pool keeps the count


def _block_id(block: KVCacheBlock | int) -> int:
    return block.block_id if isinstance(block, KVCacheBlock) else block


class LearnerPool:
    """Stage 1's pool under the engine's block pool interface (:class:`KVBlockPool`), prefix
    caching included: a cached free block is revived by taking it out of your free list, and
    evicted from ``cached_blocks`` (the map the prefix cache publishes into) when your
    ``allocate`` hands it out again."""

    def __init__(self, pool: Stage1Pool, num_blocks: int, calls: Counter) -> None:
        self.pool, self.calls, self.num_blocks = pool, calls, num_blocks
        self.blocks = [_BlockView(pool, i) for i in range(num_blocks)]
        self.cached_blocks = CachedBlocks()

    @property
    def num_free_blocks(self) -> int:
        return len(self.pool.free_list)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def allocate(self, n: int) -> list[KVCacheBlock]:
        self.calls[1] += 1
        self.calls[1, "allocate"] += 1
        blocks: list[KVCacheBlock] = [self.blocks[i] for i in self.pool.allocate(n)]
        for block in blocks:
            if block.block_hash is not None:
                self.cached_blocks.evict(block)
        return blocks

    def free(self, blocks: Iterable[KVCacheBlock | int]) -> None:
        self.calls[1] += 1
        self.calls[1, "free"] += 1
        self.pool.free([_block_id(b) for b in blocks])

    def share(self, block: KVCacheBlock | int) -> None:
        self.pool.share(_block_id(block))

    def touch(self, block: KVCacheBlock | int) -> None:
        block_id = _block_id(block)
        if self.pool.ref_cnt[block_id] == 0:
            self.pool.free_list.remove(block_id)
        self.pool.ref_cnt[block_id] += 1


def learner_fork(learner: ModuleType, calls: Counter) -> Callable[[KVBlockPool, list[int]], list[int]]:
    """``EnginePlugins.fork``: your ``fork(pool, block_ids)`` (its signature is the engine's)."""

    def fork(pool: KVBlockPool, block_ids: list[int]) -> list[int]:
        calls[1] += 1
        calls[1, "fork"] += 1
        return learner.fork(pool, block_ids)

    return fork


# -- stage 3: your slot mappings for every step ------------------------------------------------
def step_kind(starts: SequenceOf[int], ends: SequenceOf[int]) -> str:
    """``"decode"`` (one new token each), ``"prefill"`` (no decode row) or ``"mixed"``."""
    decodes = sum(e - s == 1 for s, e in zip(starts, ends))
    return "decode" if decodes == len(starts) else "prefill" if decodes == 0 else "mixed"


def learner_slot_mapping(learner: ModuleType, calls: Counter) -> Callable[..., torch.Tensor]:
    """``EnginePlugins.slot_mapping`` from your two functions, on every kind of step.

    The engine asks for the slots of positions ``starts[i] .. ends[i] - 1`` of each sequence.
    Rows with one new token (decodes, or a 1-token chunk) go to your ``decode_slot_mapping``
    (``context_lens = ends``). The others go to your ``prefill_slot_mapping``, which writes a
    sequence from position 0: a chunk of a long prompt, or the rest of a prompt after a prefix
    hit, starts further on, so it maps positions ``0 .. ends[i] - 1`` and the slice from
    ``starts[i]`` is taken (those first slots are the same whichever step writes them).
    """

    def slot_mapping(
        tables: SequenceOf[SequenceOf[int]],
        starts: SequenceOf[int],
        ends: SequenceOf[int],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        kind = step_kind(starts, ends)
        calls[3] += 1
        calls[3, kind] += 1
        if any(s > 0 and e - s > 1 for s, e in zip(starts, ends)):
            calls[3, "mid-sequence"] += 1  # a chunk after the first, or a prefill after a prefix hit
        ids = [list(t) for t in tables]
        rows: list[torch.Tensor] = [torch.empty(0, dtype=torch.int64)] * len(ids)
        decode = [i for i in range(len(ids)) if ends[i] - starts[i] == 1]
        prefill = [i for i in range(len(ids)) if ends[i] - starts[i] != 1]
        if decode:
            slots = learner.decode_slot_mapping([ids[i] for i in decode], [ends[i] for i in decode], block_size)
            for k, i in enumerate(decode):
                rows[i] = slots[k : k + 1]
        if prefill:
            lens = [ends[i] for i in prefill]
            slots = learner.prefill_slot_mapping([ids[i] for i in prefill], lens, block_size, pad_to=sum(lens))
            at = 0
            for i, n in zip(prefill, lens):
                rows[i] = slots[at + starts[i] : at + n]
                at += n
        return torch.cat(rows).to(device=device, dtype=torch.int64)

    return slot_mapping


# -- stage 5: your schedule as the scheduler's policy ------------------------------------------
def learner_policy(learner: ModuleType, calls: Counter) -> Callable[[Scheduler], ScheduledBatch]:
    """``EnginePlugins.scheduler_policy``: your ``schedule`` decides, the scheduler carries it out.

    A waiting prompt's prefix hit counts as computed tokens, but taking a hit takes its blocks
    (a cached free block leaves the free list): as the package's policy does, each waiting
    sequence is matched (``Scheduler.match_waiting``, which holds the hit in the step's
    transaction) only once those before it are admitted.
    So your ``schedule`` is asked first with the running sequences and no waiting ones, then with
    the first waiting one, matched, then the first two, ...; the step is its answer for the
    longest front of the queue it admits whole. ``Scheduler.carry_out`` then gives back the hit
    of the one left out, preempts, admits and grows what you decided. (Two prompts admitted in
    the same step do not share what the first publishes in it: the package's policy matches each
    after the one before it has its blocks.)
    """

    def policy(scheduler: Scheduler) -> ScheduledBatch:
        calls[5] += 1
        kv = scheduler.kv
        assert isinstance(kv, PagedKVManager)  # build() makes a paged engine
        waiting, running = list(scheduler.waiting), list(scheduler.running)
        names: dict[str, Sequence] = {f"R{s.seq_id}": s for s in [*running, *waiting]}
        hits: dict[int, int] = {}  # seq_id -> tokens hit, for the waiting ones matched so far

        def computed(s: Sequence) -> int:
            return hits.get(s.seq_id, s.num_computed_tokens)

        def record(s: Sequence) -> object:
            blocks = hits[s.seq_id] // kv.block_size if s.seq_id in hits else len(s.block_table.block_ids)
            return learner.Seq(f"R{s.seq_id}", len(s), computed(s), blocks)

        def decide(front: list[Sequence]) -> tuple[Any, int]:  # (your Step, how many it admits)
            step = learner.schedule(
                [record(s) for s in front], [record(s) for s in running], kv.pool.num_free_blocks,
                kv.table_block_size, scheduler.max_num_seqs, scheduler.max_num_batched_tokens,
            )  # fmt: skip
            return step, sum(names[name] in front for name, _ in step.scheduled)

        step, _ = decide([])
        for k in range(1, len(waiting) + 1):
            if step.preempted:  # memory is tight: nobody is admitted
                break
            hits[waiting[k - 1].seq_id] = scheduler.match_waiting(waiting[k - 1])
            longer, admitted = decide(waiting[:k])
            if admitted < k:
                break
            step = longer
        if step.preempted:
            calls[5, "preempted"] += 1
        if any(computed(names[name]) + n < len(names[name]) for name, n in step.scheduled):
            calls[5, "chunked"] += 1
        return scheduler.carry_out([(names[name], n) for name, n in step.scheduled], [names[p] for p in step.preempted])

    return policy


# -- stage 6: your hashes, prefix lookup and copy-on-write -------------------------------------
def learner_block_hashes(learner: ModuleType, calls: Counter) -> Callable[..., list[int]]:
    """``EnginePlugins.block_hashes``: your ``chain_block_hashes`` names every full block (from
    scratch each time: the engine's ``known`` hashes are not reused, and there is no extra key)."""

    def block_hashes(
        token_ids: SequenceOf[int], block_size: int, known: list[int] | None = None, extra_key: object = None
    ) -> list[int]:
        calls[6] += 1
        calls[6, "chain_block_hashes"] += 1
        return learner.chain_block_hashes(list(token_ids), block_size)

    return block_hashes


def learner_prefix_lookup(learner: ModuleType, calls: Counter) -> Callable[..., list[KVCacheBlock]]:
    """``EnginePlugins.prefix_lookup``: your ``reusable_prefix_tokens`` says how many tokens of a
    new prompt the cache gives (from the cache's ``block_hash -> token ids``); the engine then
    takes those blocks. Your count must be whole cached blocks, never the last token's."""

    def prefix_lookup(
        cache: PrefixIndex, block_hashes: SequenceOf[int], token_ids: SequenceOf[int], block_size: int
    ) -> list[KVCacheBlock]:
        calls[6] += 1
        calls[6, "reusable_prefix_tokens"] += 1
        n = learner.reusable_prefix_tokens(list(token_ids), block_size, cache.cached_tokens())
        if n % block_size or n // block_size > len(block_hashes):
            raise ValueError(
                f"reusable_prefix_tokens gave {n} tokens of a {len(token_ids)}-token prompt: at most "
                f"{len(block_hashes)} whole blocks of {block_size} can be reused"
            )
        if n:
            calls[6, "hit"] += 1
        hits = [cache.blocks.get(h) for h in block_hashes[: n // block_size]]
        if any(b is None for b in hits):
            raise ValueError(f"reusable_prefix_tokens gave {n} tokens, but not all of their blocks are cached")
        return [b for b in hits if b is not None]

    return prefix_lookup


def learner_copy_on_write(
    learner: ModuleType, calls: Counter
) -> Callable[[KVBlockPool, list[int], int], tuple[int, int] | None]:
    """``EnginePlugins.copy_on_write``: your ``copy_on_write`` on the one table about to write.

    It gets the table, the reference counts of its blocks and, when its block ``idx`` is shared,
    the free queue's front: the block the pool hands out for the copy (taken from the pool first,
    and given back if your function writes in place).
    """

    def copy_on_write(pool: KVBlockPool, block_ids: list[int], idx: int) -> tuple[int, int] | None:
        calls[6] += 1
        calls[6, "copy_on_write"] += 1
        old = block_ids[idx]
        ref_cnt = {b: pool.blocks[b].ref_cnt for b in block_ids}
        spare = [b.block_id for b in pool.allocate(1)] if ref_cnt[old] > 1 else []
        [table] = learner.copy_on_write([list(block_ids)], ref_cnt, list(spare), idx)
        new = table[idx]
        if new == old:
            pool.free(spare)
            return None
        if [new] != spare or table[:idx] + table[idx + 1 :] != block_ids[:idx] + block_ids[idx + 1 :]:
            raise ValueError(f"copy_on_write gave table {table} for {block_ids} (block {idx}, free {spare})")
        calls[6, "copied"] += 1
        pool.free([old])
        block_ids[idx] = new
        return old, new

    return copy_on_write


# -- stages 2, 4, 7: your attention pieces as an attention backend -----------------------------
class LearnerBackend(TorchBackend):
    """The package's batched torch attention, with your store kernel (stage 4), your decode
    kernel (stage 7) and your gather for the prefill (stage 2, else stage 3) where you have them."""

    name = "yours"

    def __init__(self, parts: dict[int, ModuleType], calls: Counter) -> None:
        super().__init__()
        self.parts, self.calls = parts, calls
        self.gather_stage = 2 if 2 in parts else 3 if 3 in parts else None
        self.gather = {2: "gather", 3: "gather_sequence_kv"}.get(self.gather_stage or 0)

    def store_kvcache(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
    ) -> None:
        if 4 not in self.parts:
            return super().store_kvcache(key, value, k_cache, v_cache, slots)
        self.calls[4] += 1
        kernel = self.parts[4].store_kvcache_kernel  # your kernel, through the given launcher
        launch_store(key.contiguous(), value.contiguous(), k_cache, v_cache, slots, kernel=kernel)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedMetadata, plan: BatchPlan
    ) -> torch.Tensor:
        if plan.one_token and 7 in self.parts:  # a decode step: your kernel takes one query per sequence
            self.calls[7] += 1
            kernel = self.parts[7].paged_decode_kernel
            return launch_decode(q.contiguous(), k_cache, v_cache, meta.block_tables, meta.context_lens, kernel=kernel)
        if plan.one_token or self.gather_stage is None or self.gather is None:
            return super().attend(q, k_cache, v_cache, meta, plan)
        self.calls[self.gather_stage] += 1
        gather = getattr(self.parts[self.gather_stage], self.gather)
        out = torch.empty_like(q)
        bounds = meta.cu_seqlens_q.tolist()
        for i, context_len in enumerate(meta.host_context_lens):
            k = gather(k_cache, meta.block_tables[i], context_len)
            v = gather(v_cache, meta.block_tables[i], context_len)
            out[bounds[i] : bounds[i + 1]] = reference.causal_attention(q[bounds[i] : bounds[i + 1]], k, v)
        return out
