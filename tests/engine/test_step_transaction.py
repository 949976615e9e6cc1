"""The step's transaction on its own: what it stages for the prefix cache and when that is
published, what a lookup sees in the middle of a step, and what a rollback gives back."""

from __future__ import annotations

import torch
from rows import add_row

from minipaged import SamplingParams
from minipaged.engine.request_group import SampleGroup
from minipaged.engine.step_transaction import StepTransaction
from minipaged.kv.block_pool import BlockPool
from minipaged.kv.prefix_cache import PrefixCache, chain_hashes

BS = 2


def setup() -> tuple[BlockPool, PrefixCache, StepTransaction]:
    pool = BlockPool(8)
    cache = PrefixCache(pool)
    return pool, cache, StepTransaction(BS, cache)


def test_staged_blocks_reach_the_cache_at_commit_in_the_order_they_filled():
    pool, cache, tx = setup()
    a, b = pool.allocate(2)
    ha, hb = chain_hashes([1, 2, 3, 4], BS)
    tx.stage(a, ha, [1, 2], None)
    tx.stage(b, hb, [3, 4], a)
    assert len(cache) == 0 and [s.block for s in tx.staged] == [a, b]
    assert tx.prefix_index().find([ha, hb], [1, 2, 3, 4], BS) == [a, b]  # the step's own lookups see them
    tx.commit()
    assert cache.blocks == {ha: a, hb: b} and not tx.staged
    assert cache.find([ha, hb], [1, 2, 3, 4], BS) == [a, b]


def test_a_second_copy_is_staged_and_chains_on_but_an_orphan_stays_private():
    pool, cache, tx = setup()
    a, twin, after_twin, orphan_parent, orphan = pool.allocate(5)
    ha, hb = chain_hashes([1, 2, 3, 4], BS)
    tx.stage(a, ha, [1, 2], None)
    tx.stage(twin, ha, [1, 2], None)  # the same prefix computed twice in one step
    tx.stage(after_twin, hb, [3, 4], twin)  # chains on from the copy (vLLM finds it through a's hash)
    tx.stage(orphan, hb, [3, 4], orphan_parent)  # its parent was never staged: no lookup reaches it
    assert [s.block for s in tx.staged] == [a, twin, after_twin]
    assert tx.prefix_index().find([ha, hb], [1, 2, 3, 4], BS) == [a, after_twin]
    tx.commit()
    assert cache.blocks == {ha: a, hb: after_twin} and cache.copies == {ha: [twin]}
    assert cache.find([ha, hb], [1, 2, 3, 4], BS) == [a, after_twin] and orphan.block_hash is None


def test_a_rollback_publishes_nothing_and_gives_every_draw_back():
    pool, cache, tx = setup()
    group = SampleGroup(3, None, [1, 2, 3], SamplingParams(n=2, seed=9, max_tokens=2), BS)
    parent = group.seqs[0]
    add_row(tx, parent, 3, [0, 1])  # the prompt's last token: both samples draw from its row
    assert tx.batch.samples == [(0, parent), (0, group.seqs[1])]
    first = [torch.rand(1, generator=s.generator).item() for s in group.seqs]
    (block,) = pool.allocate(1)
    tx.stage(block, chain_hashes([1, 2], BS)[0], [1, 2], None)
    tx.rollback()
    assert [torch.rand(1, generator=s.generator).item() for s in group.seqs] == first
    assert len(cache) == 0 and not tx.staged and block.block_hash is None
    assert tx.failed_request_ids == [3]
