"""The engine's plug-in points: the pieces of a paged engine that can be swapped for your own.

An :class:`EnginePlugins` names one function (or class) for each piece; ``LLM(plugins=...)``
builds the engine with them. Every field defaults to the package's own piece, and the engine
always calls its pieces through these fields, so a default engine runs exactly the code a
plugged one replaces. The names are vLLM v1's.

- ``block_pool`` (:class:`~minipaged.kv.block_pool.BlockPool`): called once, ``block_pool(num_blocks)``
  builds the pool, any :class:`~minipaged.kv.block_pool.KVBlockPool`;
- ``append_tokens`` (:meth:`~minipaged.kv.block_table.BlockTable.append_tokens`): whenever a
  sequence's step brings tokens, ``(block_table, num_new_tokens, pool)`` grows the table (a new
  block from the pool only when the last one is full) and returns the new blocks' ids;
- ``slot_mapping`` (:func:`~minipaged.kv.slot_mapping.build_slot_mapping`): every step,
  ``(block_tables, starts, ends, block_size, device)`` -> int64 ``[num_new_tokens]``;
- ``block_hashes`` (:func:`~minipaged.kv.prefix_cache.chain_hashes`): when a prompt arrives and
  when a step fills blocks, ``(token_ids, block_size, known, extra_key)`` -> the ``block_hash``
  of every full block (``known``, a prefix of them, may be reused);
- ``prefix_lookup`` (:meth:`~minipaged.kv.prefix_cache.PrefixIndex.find`): when a prompt arrives,
  ``(prefix_index, block_hashes, token_ids, block_size)`` -> the cached blocks of its longest
  cached prefix, no reference taken (the engine takes them; ``block_hashes`` stop before the
  block holding the last token). ``prefix_index`` is the prefix cache together with the blocks
  the step is filling (:class:`~minipaged.kv.prefix_cache.PrefixIndex`);
- ``copy_on_write`` (:func:`~minipaged.kv.prefix_cache.copy_on_write`): before a step writes
  into a block its table already holds, ``(pool, block_ids, idx)`` -> the ``(src, dst)`` copy
  owed (``block_ids[idx]`` replaced), or None to write in place;
- ``fork`` (:func:`~minipaged.kv.block_pool.fork_blocks`): when the ``n`` samples of a prompt,
  or beams, branch, ``(pool, parent_block_ids)`` -> the child's block ids;
- ``scheduler_policy`` (:meth:`~minipaged.engine.scheduler.Scheduler.schedule_fcfs`): every
  step, ``(scheduler)`` -> the step's :class:`~minipaged.engine.scheduler_output.SchedulerOutput`;
- ``attention_backend`` (None: the one ``attention_backend=`` names): an
  :class:`~minipaged.attention.backends.AttentionBackend` that writes and reads the cache in
  every layer of every step.

The memory pieces (all but ``slot_mapping`` and ``scheduler_policy``) apply to
``kv_layout="paged"``. A policy of your own decides from the scheduler's public state
(``waiting``, ``running``, ``kv``, ``group_of``) and hands its decisions to
:meth:`~minipaged.engine.scheduler.Scheduler.carry_out`, which makes the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from minipaged.attention.backends import AttentionBackend
from minipaged.engine.scheduler import Scheduler
from minipaged.engine.scheduler_output import SchedulerOutput
from minipaged.kv.block_pool import BlockPool, KVBlockPool, fork_blocks
from minipaged.kv.block_table import BlockTable
from minipaged.kv.kv_cache_block import KVCacheBlock
from minipaged.kv.prefix_cache import PrefixIndex, chain_hashes, copy_on_write
from minipaged.kv.slot_mapping import SlotMappingFn, build_slot_mapping

BlockPoolFactory = Callable[[int], KVBlockPool]
AppendTokensFn = Callable[[BlockTable, int, KVBlockPool], list[int]]
BlockHashFn = Callable[[Seq[int], int, "list[int] | None", object], list[int]]
PrefixLookupFn = Callable[[PrefixIndex, Seq[int], Seq[int], int], list[KVCacheBlock]]
CopyOnWriteFn = Callable[[KVBlockPool, list[int], int], "tuple[int, int] | None"]
ForkFn = Callable[[KVBlockPool, list[int]], list[int]]
SchedulerPolicy = Callable[[Scheduler], SchedulerOutput]


@dataclass(frozen=True)
class EnginePlugins:
    """One engine's pieces (see the module docstring); ``EnginePlugins()`` is the package's engine."""

    block_pool: BlockPoolFactory = BlockPool
    append_tokens: AppendTokensFn = BlockTable.append_tokens
    slot_mapping: SlotMappingFn = build_slot_mapping
    block_hashes: BlockHashFn = chain_hashes
    prefix_lookup: PrefixLookupFn = PrefixIndex.find
    copy_on_write: CopyOnWriteFn = copy_on_write
    fork: ForkFn = fork_blocks
    scheduler_policy: SchedulerPolicy = Scheduler.schedule_fcfs
    attention_backend: AttentionBackend | None = None
