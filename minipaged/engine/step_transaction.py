"""A step's transaction: everything one engine step changes, in one object, until it commits or
rolls back.

Between ``schedule`` and ``postprocess`` a step has changed things that only make sense if the
forward succeeds. They are all recorded here:

- ``batch``: the rows it scheduled (the sequences that took seats and blocks), the copies it owes
  (``blocks_to_copy``) and the blocks it moves to or from host memory;
- ``staged``: the blocks it fills, waiting to be published to the prefix cache. A block reaches
  the cache only at :meth:`commit`, once the forward has written its K/V. A request admitted
  later in the same step may still share a staged block: its prefix lookup reads the cache and
  the staged blocks together (:meth:`prefix_index`, the same token and parent checks). That is
  safe because every attention layer stores the whole batch's K/V before any of its queries
  read (:class:`~minipaged.attention.cache_attention.PagedAttention`), so the sharer reads them
  in place;
- ``rng_states``: the random state of every seeded sample that draws in it;
- ``held``: prefix hits taken for waiting sequences a scheduling policy may still admit
  (:meth:`~minipaged.engine.scheduler.Scheduler.match_waiting`);
- ``first_admitted``: the sequences admitted for the first time (their ``num_cached_tokens`` is set
  then, once);
- ``failed_request_ids``: after a rollback, the requests the step ran.

:meth:`commit` publishes what was staged; :meth:`rollback` gives every draw back and forgets the
rest (the scheduler puts the sequences back to wait, and frees their blocks).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from minipaged.engine.prefix_hit import PrefixHit
from minipaged.engine.scheduler_output import SchedulerOutput
from minipaged.engine.sequence import Sequence
from minipaged.kv.cached_blocks import CachedEntry
from minipaged.kv.kv_cache_block import KVCacheBlock
from minipaged.kv.prefix_cache import PrefixCache, PrefixIndex


@dataclass
class StagedBlock:
    """A block this step fills: its hash, its tokens and the block before it in its sequence."""

    block: KVCacheBlock
    block_hash: int
    token_ids: tuple[int, ...]
    parent: KVCacheBlock | None


class StepTransaction:
    """What one step changed (the module docstring); ``prefix_cache``: where staged blocks go."""

    def __init__(self, block_size: int, prefix_cache: PrefixCache | None = None) -> None:
        self.batch = SchedulerOutput(block_size=block_size)
        self.prefix_cache = prefix_cache
        self.staged: list[StagedBlock] = []  # in the order they fill
        self._staged_blocks: dict[int, KVCacheBlock] = {}  # block_hash -> block, as PrefixCache.blocks
        self._staged_entries: dict[int, CachedEntry] = {}  # block_id -> what it will hold, as PrefixCache.entries
        self.rng_states: list[tuple[torch.Generator, torch.Tensor]] = []
        self.held: dict[int, tuple[Sequence, PrefixHit]] = {}  # seq_id -> (waiting sequence, its hit)
        self.first_admitted: list[Sequence] = []
        self.failed_request_ids: list[int] = []

    def add(
        self,
        seq: Sequence,
        num_tokens: int,
        block_table: Seq[int],
        samplers: Seq[Sequence] = (),
        num_candidates: int = 0,
        scored: tuple[range, int] | None = None,
    ) -> None:
        """A row of the batch for ``seq``'s ``num_tokens`` new tokens, starting at its computed
        ones. If the row reaches ``seq``'s last token, ``samplers`` (its request group says who)
        draw from its logits (``num_candidates`` > 0: a beam's top candidates instead); their
        random state is kept, to give the draw back on rollback. ``scored``: the prompt tokens
        (positions, alternatives) whose logprobs the row scores, if its request asked."""
        b = self.batch
        row = len(b.seqs)
        b.seqs.append(seq)
        b.q_lens.append(num_tokens)
        b.starts.append(seq.num_computed_tokens)
        b.block_tables.append(block_table)
        b.decode.append(seq.is_decode(num_tokens))
        if scored is not None:
            b.prompt_logprobs.append((row, *scored))
        if seq.num_computed_tokens + num_tokens == len(seq):
            for s in samplers:
                b.samples.append((row, s))
                b.candidates.append(num_candidates)
                if s.generator is not None:
                    self.rng_states.append((s.generator, s.generator.get_state()))

    # -- the prefix cache's side -----------------------------------------------------------
    def stage(self, block: KVCacheBlock, block_hash: int, token_ids: Seq[int], parent: KVCacheBlock | None) -> None:
        """Offer a block this step fills, to be published at :meth:`commit`, by the cache's own
        rule (:meth:`~minipaged.kv.prefix_cache.PrefixIndex.entry_for`) over the cache and the
        blocks staged before it."""
        if self.prefix_cache is None or block.block_hash is not None:
            return
        entry = self.prefix_index().entry_for(block_hash, token_ids, parent)
        if entry is None:
            return
        self.staged.append(StagedBlock(block, block_hash, tuple(token_ids), parent))
        self._staged_blocks.setdefault(block_hash, block)
        self._staged_entries[block.block_id] = entry

    def prefix_index(self) -> PrefixIndex:
        """What a prefix lookup reads in this step: the cache, then the blocks the step fills."""
        assert self.prefix_cache is not None
        cache = self.prefix_cache
        return PrefixIndex(ChainMap(cache.blocks, self._staged_blocks), ChainMap(cache.entries, self._staged_entries))

    # -- the outcome -----------------------------------------------------------------------
    def commit(self) -> None:
        """The forward wrote the step's K/V: publish the staged blocks, in the order they filled."""
        if self.prefix_cache is not None:
            for s in self.staged:
                self.prefix_cache.insert(s.block, s.block_hash, s.token_ids, s.parent)
        self._forget_staged()

    def rollback(self) -> None:
        """The step failed: every seeded sample gets its draw back; nothing staged is published;
        a first admission is undone (the next one may find other hits)."""
        for generator, state in self.rng_states:
            generator.set_state(state)
        for seq in self.first_admitted:
            seq.num_cached_tokens = None
        self._forget_staged()
        self.failed_request_ids = sorted({s.request_id for s in self.batch.seqs})

    def _forget_staged(self) -> None:
        self.staged.clear()
        self._staged_blocks.clear()
        self._staged_entries.clear()
