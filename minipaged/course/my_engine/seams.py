"""Each piece of the learner's ``my_engine`` at one seam of the package's engine.

The engine's seams are :class:`~minipaged.engine.plugins.EnginePlugins`' fields; a learner's
module answers in its own stage's terms, and one adapter per seam translates:

- :class:`LearnerPool` (``block_pool``): stage 1's ``BlockPool`` holds every block of the engine.
  The engine reads and sets its blocks' ``ref_cnt`` / ``block_hash`` and calls ``allocate``,
  ``free``, ``share``, ``touch``; when the learner's ``allocate`` hands out a cached block (its
  ``on_evict`` seam), the block leaves the pool's map of cached blocks;
- :func:`learner_append_tokens` (``append_tokens``): stage 2's ``BlockTable.append_tokens`` grows
  every sequence's table whenever a step brings it tokens;
- :func:`learner_slot_mapping` (``slot_mapping``): stage 3's ``slot_mapping``, every step;
- :class:`LearnerAttention` (``attention_backend``): stage 3's ``store_kv`` in every layer, its
  ``paged_decode_attention`` for steps of one new token per sequence and its
  ``paged_prefill_attention`` for the others (the package's torch attention where a piece is
  not the learner's yet);
- :func:`learner_scheduler` (``scheduler_policy``): stage 5's ``Scheduler`` decides every step
  on a mirror of the engine's state, and the engine carries its decision out;
- :func:`learner_block_hashes`, :func:`learner_prefix_lookup` (``block_hashes``,
  ``prefix_lookup``): stage 6's hashes name every full block, and its ``PrefixCache`` finds a new
  prompt's hits in the engine's ``block_hash -> block`` map;
- stage 6's ``fork`` and ``copy_on_write`` plug in as they are (their signatures are the engine's).

Every adapter counts its calls in ``calls`` (a :class:`~collections.Counter` by piece), so a
report can say what the learner's code did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from types import ModuleType
from typing import Any

import torch

from minipaged.attention.batched import TorchBackend
from minipaged.attention.metadata import PagedMetadata
from minipaged.engine.scheduler import Scheduler
from minipaged.engine.scheduler_output import SchedulerOutput
from minipaged.engine.sequence import Sequence, Status
from minipaged.kv.block_pool import KVCacheBlock, NoFreeBlocksError
from minipaged.kv.block_table import BlockTable
from minipaged.kv.cached_blocks import CachedBlocks
from minipaged.kv.prefix_cache import PrefixIndex


class LearnerPool:
    """Stage 1's pool as the engine's block pool (:class:`~minipaged.kv.block_pool.KVBlockPool`).

    The learner's blocks are the engine's blocks: the prefix cache publishes them into
    ``cached_blocks`` (the map ``block_hash -> block`` a pool owns) and sets their ``block_hash``.
    When the learner's ``allocate`` hands out a cached block, its ``on_evict`` seam tells the map;
    a cached block handed out without it is evicted here all the same, so the map never names a
    block that holds other tokens.
    """

    def __init__(self, pool: Any, calls: Counter) -> None:
        self.pool, self.calls = pool, calls
        self.num_blocks = len(pool.blocks)
        self.cached_blocks = CachedBlocks()
        pool.on_evict = self._forget

    def _forget(self, block: Any) -> None:
        if block.block_hash is None and block.block_id in self.cached_blocks.entries:  # cleared, not told
            block.block_hash = next(h for h, b in self.cached_blocks.blocks.items() if b is block)
        self.cached_blocks.evict(block)

    @property
    def blocks(self) -> Seq[KVCacheBlock]:
        return self.pool.blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def _block(self, block: KVCacheBlock | int) -> Any:
        return self.pool.blocks[block if isinstance(block, int) else block.block_id]

    def allocate(self, n: int) -> list[KVCacheBlock]:
        self.calls["pool.allocate"] += 1
        if n > self.pool.num_free_blocks:  # the engine's own error, whatever the learner's is called
            raise NoFreeBlocksError(f"asked for {n} blocks, only {self.pool.num_free_blocks} free")
        blocks = list(self.pool.allocate(n))
        for block in blocks:
            if block.block_hash is not None or block.block_id in self.cached_blocks.entries:
                self._forget(block)  # handed out still named: the cache must forget it
        return blocks

    def free(self, blocks: Iterable[KVCacheBlock | int]) -> None:
        self.calls["pool.free"] += 1
        self.pool.free([self._block(b) for b in blocks])

    def share(self, block: KVCacheBlock | int) -> None:
        self.calls["pool.share"] += 1
        self.pool.share(self._block(block))

    def touch(self, block: KVCacheBlock | int) -> None:
        self.calls["pool.touch"] += 1
        self.pool.touch(self._block(block))


def learner_append_tokens(stage2: ModuleType, calls: Counter) -> Callable[[BlockTable, int, Any], list[int]]:
    """``EnginePlugins.append_tokens``: stage 2's ``BlockTable.append_tokens`` on a copy of the
    engine's table (its ``block_ids`` and ``num_tokens``), whose result the engine's table takes."""

    def append_tokens(table: BlockTable, num_new_tokens: int, pool: Any) -> list[int]:
        calls["append_tokens"] += 1
        mine = stage2.BlockTable(table.block_size)
        mine.block_ids, mine.num_tokens = list(table.block_ids), table.num_tokens
        new = list(mine.append_tokens(num_new_tokens, pool))
        table.block_ids, table.num_tokens = list(mine.block_ids), mine.num_tokens
        return new

    return append_tokens


def learner_slot_mapping(stage3: ModuleType, calls: Counter) -> Callable[..., torch.Tensor]:
    """``EnginePlugins.slot_mapping``: stage 3's ``slot_mapping`` (the device is the engine's)."""

    def slot_mapping(
        block_tables: Seq[Seq[int]], starts: Seq[int], ends: Seq[int], block_size: int, device: Any = "cpu"
    ) -> torch.Tensor:
        calls["slot_mapping"] += 1
        tables = [list(t) for t in block_tables]
        return stage3.slot_mapping(tables, list(starts), list(ends), block_size).to(device=device, dtype=torch.int64)

    return slot_mapping


class LearnerAttention(TorchBackend):
    """Stage 3's K/V write and paged attention in every layer; ``mine`` names the pieces that are
    the learner's (``"store_kv"``, ``"decode"``, ``"prefill"``), the package's torch attention
    does the rest."""

    name = "my_engine"

    def __init__(self, stage3: ModuleType, mine: set[str], calls: Counter) -> None:
        super().__init__(in_place=False)
        self.stage3, self.mine, self.calls = stage3, mine, calls

    def store_kvcache(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
    ) -> None:
        if "store_kv" not in self.mine:
            return super().store_kvcache(key, value, k_cache, v_cache, slots)
        self.calls["store_kv"] += 1
        self.stage3.store_kv(key, value, k_cache, v_cache, slots)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedMetadata, plan: Any
    ) -> torch.Tensor:
        decode = all(n == 1 for n in meta.host_q_lens)
        if decode and "decode" in self.mine:
            self.calls["paged_decode_attention"] += 1
            return self.stage3.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens)
        if not decode and "prefill" in self.mine:
            self.calls["paged_prefill_attention"] += 1
            return self.stage3.paged_prefill_attention(
                q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens
            )
        return super().attend(q, k_cache, v_cache, meta, plan)


def learner_scheduler(stage5: ModuleType, pool_class: Callable[[int], Any], calls: Counter) -> Callable:
    """``EnginePlugins.scheduler_policy``: stage 5's ``Scheduler`` decides, the engine carries it out.

    Each step the learner's scheduler gets a mirror of the engine: a pool (``pool_class``, the
    learner's own when stage 1 passes) whose every block has the engine's ``ref_cnt``, a
    ``KVCacheManager`` holding each running request's blocks, and the engine's queues as
    ``Request``s. Its ``get_computed_blocks`` asks the engine for a waiting prompt's prefix hit
    only when the learner's scheduler reaches that prompt, so a hit's blocks are taken in the
    order the engine would take them. What ``schedule()`` returns, who computes how many tokens
    and who is preempted, is handed to :meth:`Scheduler.carry_out
    <minipaged.engine.scheduler.Scheduler.carry_out>`: the learner's decisions, the engine's hands.

    One difference from the package's own policy: the engine carries the decision out once the
    learner's ``schedule()`` returns, so two prompts admitted in one step do not share the blocks
    the first fills in that step (the package's policy admits one, then matches the next). The
    second computes those tokens again; its answer is the same.
    """

    def policy(scheduler: Scheduler) -> SchedulerOutput:
        calls["schedule"] += 1
        kv = scheduler.kv
        block_size = kv.table_block_size
        real = kv.block_states()[0]  # every block's ref_cnt
        mirror = pool_class(len(real))
        blocks = mirror.allocate(len(real))  # every block, then each gets the engine's ref_cnt
        for block, ref_cnt in zip(blocks, real):
            for _ in range(ref_cnt - 1):
                mirror.share(block)
        mirror.free([b for b, ref_cnt in zip(blocks, real) if ref_cnt == 0])
        names: dict[str, Sequence] = {}

        def request(seq: Sequence) -> Any:
            names[f"seq{seq.seq_id}"] = seq
            return stage5.Request(
                f"seq{seq.seq_id}", list(seq.token_ids), max_tokens=1 << 30, num_computed_tokens=seq.num_computed_tokens
            )

        manager = stage5.KVCacheManager(mirror, block_size)
        learner = stage5.Scheduler(manager, scheduler.max_num_seqs, scheduler.max_num_batched_tokens)
        for seq in scheduler.running:
            learner.running.append(request(seq))
            manager.req_to_blocks[f"seq{seq.seq_id}"] = [mirror.blocks[b] for b in kv.block_ids(seq, len(seq))]
        for seq in scheduler.waiting:
            learner.waiting.append(request(seq))

        def get_computed_blocks(req: Any) -> tuple[list[Any], int]:
            seq = names[req.request_id]
            if seq.status is not Status.WAITING or kv.prefix_cache is None:
                return [], 0
            num_hit_tokens = scheduler.match_waiting(seq)
            hit = scheduler.transaction().held[seq.seq_id][1]
            return [mirror.blocks[b.block_id] for b in hit.blocks], num_hit_tokens

        manager.get_computed_blocks = get_computed_blocks
        out = learner.schedule()
        scheduled = [(names[r], n) for r, n in out.num_scheduled_tokens.items() if n > 0]
        if out.preempted:
            calls["schedule: preempted"] += 1
        return scheduler.carry_out(scheduled, [names[r] for r in out.preempted])

    return policy


def learner_block_hashes(stage6: ModuleType, calls: Counter) -> Callable[..., list[int]]:
    """``EnginePlugins.block_hashes``: stage 6's ``block_hashes`` (no extra key: a chat has none)."""

    def block_hashes(
        token_ids: Seq[int], block_size: int, known: list[int] | None = None, extra_key: object = None
    ) -> list[int]:
        calls["block_hashes"] += 1
        return stage6.block_hashes(list(token_ids), block_size)

    return block_hashes


class _NoPool:
    on_evict: Any = None  # the learner's PrefixCache sets it; evictions reach the engine through LearnerPool


def learner_prefix_lookup(stage6: ModuleType, calls: Counter) -> Callable[..., list[KVCacheBlock]]:
    """``EnginePlugins.prefix_lookup``: stage 6's ``PrefixCache.get_computed_blocks`` over the
    engine's map ``block_hash -> block`` (the blocks published so far, and those the step fills)."""

    def prefix_lookup(
        index: PrefixIndex, block_hashes: Seq[int], token_ids: Seq[int], block_size: int
    ) -> list[KVCacheBlock]:
        calls["get_computed_blocks"] += 1
        cache = stage6.PrefixCache(_NoPool(), block_size)
        cache.cached_block_hash_to_block = dict(index.blocks)
        hits = list(cache.get_computed_blocks(list(token_ids)))
        return hits[: len(block_hashes)]  # never the block of the prompt's last token

    return prefix_lookup
