"""The paged KV manager on its own: block tables, prefix hits, copy-on-write, forks, swapping,
the step's outcome and the figures — no model, no tensors.

A step is played by hand as the scheduler plays it: ``allocate`` room for the new tokens in the
step's transaction, then (once the step "ran") count them as computed, commit, and append the
sampled token.
"""

from __future__ import annotations

import pytest

from minipaged import SamplingParams
from minipaged.engine.kv_manager import PagedKVManager
from minipaged.engine.request_group import SampleGroup
from minipaged.engine.sequence import Sequence
from minipaged.engine.step_transaction import StepTransaction
from minipaged.kv.block_pool import NoFreeBlocksError
from minipaged.kv.prefix_cache import chain_hashes

BS = 4


def seq(tokens, max_tokens: int = 8) -> Sequence:
    return SampleGroup(0, None, list(tokens), SamplingParams(temperature=0, max_tokens=max_tokens), BS).seqs[0]


def manager(num_blocks: int = 8, caching: bool = False, host: int = 0) -> PagedKVManager:
    return PagedKVManager(num_blocks, BS, caching, num_host_blocks=host)


def transaction(kv: PagedKVManager) -> StepTransaction:
    return StepTransaction(BS, kv.prefix_cache)


def step(
    kv: PagedKVManager, s: Sequence, n: int, sampled: int | None = None, tx: StepTransaction | None = None
) -> list[tuple[int, int]]:
    """Allocate ``n`` new tokens of ``s`` and let the step run (it commits, unless ``tx``, a
    transaction of the caller's, is given); ``sampled`` is appended if given. Returns the copies owed."""
    own = tx is None
    tx = tx or transaction(kv)
    kv.allocate_slots(s, n, tx)
    s.num_computed_tokens += n
    if own:
        tx.commit()
    if sampled is not None:
        s.token_ids.append(sampled)
    return tx.batch.blocks_to_copy


def admit(kv: PagedKVManager, s: Sequence, tx: StepTransaction | None = None) -> int:
    """Admit waiting ``s`` with its prefix hit, as the scheduler does; returns the tokens hit."""
    tx = tx or transaction(kv)
    hit = kv.get_computed_blocks(s, tx)
    kv.hold(hit)
    s.num_computed_tokens = kv.attach(s, hit)
    return s.num_computed_tokens


def forked_pair(kv: PagedKVManager, prompt_len: int = 6):
    """A parent that computed its prompt and a sample forked from it; each sampled a different token."""
    parent, child = seq(range(1, prompt_len + 1)), seq(range(1, prompt_len + 1))
    step(kv, parent, prompt_len, sampled=50)
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens
    child.token_ids.append(51)
    return parent, child


def refs(kv: PagedKVManager, pool=None) -> list[int]:
    return [b.ref_cnt for b in (pool or kv.pool).blocks]


def pool_view(kv: PagedKVManager) -> tuple[list[int], list[bool], int]:
    """The pool as a snapshot reads it: every block's ref_cnt, whether it is cached, the free count."""
    return refs(kv), [b.block_hash is not None for b in kv.pool.blocks], kv.pool.num_free_blocks


# -- growth --------------------------------------------------------------------------------
def test_block_ids_grow_one_block_when_the_last_one_fills():
    kv = manager()
    a = seq(range(1, 7))
    assert step(kv, a, 6, sampled=9) == []
    assert kv.block_ids(a, 6) == [0, 1] and a.block_table.num_tokens == 6
    step(kv, a, 1, sampled=9)  # token 7 fits in block 1
    step(kv, a, 1, sampled=9)  # token 8 fills it
    assert kv.block_ids(a, 8) == [0, 1] and kv.pool.num_free_blocks == 6
    step(kv, a, 1)  # token 9 opens block 2
    assert kv.block_ids(a, 9) == [0, 1, 2] and a.block_table.num_tokens == 9
    assert refs(kv) == [1, 1, 1, 0, 0, 0, 0, 0]


def test_a_chunked_prompt_allocates_only_the_chunk():
    kv = manager()
    a = seq(range(1, 11))
    step(kv, a, 3)
    assert kv.block_ids(a, 3) == [0] and a.block_table.num_tokens == 3
    step(kv, a, 7)
    assert kv.block_ids(a, 10) == [0, 1, 2] and a.block_table.num_tokens == 10


def test_can_schedule_counts_the_blocks_the_plan_needs():
    kv = manager(num_blocks=3)
    assert kv.can_schedule([seq(range(12))], [12])  # 3 blocks
    assert not kv.can_schedule([seq(range(13))], [13])  # 4 blocks
    a = seq(range(10))
    step(kv, a, 6)  # 2 blocks taken, 1 free; 6 computed tokens leave 2 slots in block 1
    assert kv.can_schedule([a], [2])  # fits in block 1: no new block
    assert kv.can_schedule([a], [4])  # 2 in block 1, 2 in the one free block
    assert not kv.can_schedule([a, seq(range(5))], [4, 1])  # a's new block + the other's first
    assert kv.can_schedule([a, seq(range(5))], [4, 0])


def test_allocate_raises_and_leaves_the_table_when_the_pool_is_short():
    kv = manager(num_blocks=2)
    a = seq(range(12))
    with pytest.raises(NoFreeBlocksError):
        kv.allocate_slots(a, 12, transaction(kv))
    assert a.block_table.block_ids == [] and a.block_table.num_tokens == 0 and kv.pool.num_free_blocks == 2


# -- forks and copy-on-write ---------------------------------------------------------------
def test_fork_shares_every_block_and_the_hashes():
    kv = manager(caching=True)
    parent = seq(range(1, 10))
    step(kv, parent, 9, sampled=50)
    child = seq(range(1, 10))
    kv.fork(parent, child)
    assert child.block_table.block_ids == parent.block_table.block_ids == [0, 1, 2]
    assert child.block_table.num_tokens == 9
    assert refs(kv)[:4] == [2, 2, 2, 0]
    assert child.block_hashes == parent.block_hashes == chain_hashes(list(range(1, 10)), BS)
    assert child.block_hashes is not parent.block_hashes
    assert kv.stats()["blocks_saved"] == 3


def test_the_first_writer_of_a_shared_partial_block_copies_it():
    kv = manager()
    parent, child = forked_pair(kv)  # share blocks [0, 1]; block 1 holds 2 of the prompt's 6 tokens
    assert kv.can_schedule([parent, child], [1, 1])  # one copy: needs 1 free block
    copies = step(kv, child, 1)
    assert copies == [(1, 2)]  # the K/V of tokens 4-5 go to the child's own block 2
    assert child.block_table.block_ids == [0, 2] and parent.block_table.block_ids == [0, 1]
    assert refs(kv)[:3] == [2, 1, 1]
    assert step(kv, parent, 1) == []  # block 1 is the parent's alone now: written in place
    assert parent.block_table.block_ids == [0, 1]
    assert kv.stats()["cow_copies"] == 1 and kv.num_cow_copies == 1


def test_two_writers_of_a_block_nobody_else_holds_need_one_copy():
    kv = manager(num_blocks=3)
    parent, child = forked_pair(kv)  # blocks [0, 1] shared, one block free
    assert kv.can_schedule([parent, child], [1, 1])  # one copies block 1, the other keeps it
    full = manager(num_blocks=2)
    p2, c2 = forked_pair(full)
    assert not full.can_schedule([p2, c2], [1, 1])  # the copy has no block to go to


def test_a_lone_writer_of_a_block_shared_with_others_copies():
    kv = manager(num_blocks=2)
    parent, child = forked_pair(kv)
    # child alone writes into block 1 that the parent keeps: one copy, and the pool has none free
    assert not kv.can_schedule([child], [1])
    with pytest.raises(NoFreeBlocksError):
        kv.allocate_slots(child, 1, transaction(kv))
    assert child.block_table.block_ids == [0, 1] and refs(kv) == [2, 2] and kv.num_cow_copies == 0


def test_a_fork_on_a_block_boundary_copies_nothing():
    kv = manager()
    parent, child = forked_pair(kv, prompt_len=8)  # blocks [0, 1], both full
    assert step(kv, child, 1) == [] and step(kv, parent, 1) == []
    assert child.block_table.block_ids == [0, 1, 2] and parent.block_table.block_ids == [0, 1, 3]
    assert refs(kv)[:4] == [2, 2, 1, 1] and kv.num_cow_copies == 0


def test_free_drops_one_reference_and_frees_the_tail_first():
    kv = manager()
    parent, child = forked_pair(kv)
    step(kv, child, 1)  # child: [0, 2]
    kv.free(child)
    assert child.block_table.block_ids == [] and child.block_table.num_tokens == 0
    assert refs(kv)[:3] == [1, 1, 0]
    kv.free(parent)
    assert kv.pool.num_free_blocks == 8
    # freed in reverse: the parent's tail block 1 before its first block 0
    assert [b.block_id for b in kv.pool.free_queue] == [3, 4, 5, 6, 7, 2, 1, 0]


# -- prefix caching ------------------------------------------------------------------------
def written(kv: PagedKVManager, tokens) -> Sequence:
    """A sequence whose whole prompt was computed by a step that succeeded, then freed."""
    s = seq(tokens)
    assert admit(kv, s) == 0
    step(kv, s, len(s))
    kv.mark_written()
    kv.free(s)
    return s


def test_a_prefix_hit_shares_the_cached_full_blocks():
    kv = manager(caching=True)
    written(kv, range(1, 10))  # blocks 0, 1 full and published; block 2 partial
    assert kv.stats()["cached_blocks"] == 2
    b = seq([*range(1, 9), 20, 21])
    assert admit(kv, b) == 8
    assert b.block_table.block_ids == [0, 1] and b.block_table.num_tokens == 8
    assert refs(kv)[:3] == [1, 1, 0]
    assert step(kv, b, 2) == []
    assert b.block_table.block_ids == [0, 1, 3]  # block 2 waits behind the never-used ones


def test_finding_a_hit_changes_nothing_until_it_is_held():
    kv = manager(caching=True)
    written(kv, range(1, 10))
    b = seq([*range(1, 9), 20, 21])
    free = kv.pool.num_free_blocks
    hit = kv.get_computed_blocks(b, transaction(kv))
    assert [x.block_id for x in hit.blocks] == [0, 1] and hit.block_hashes == chain_hashes(b.token_ids, BS)
    assert (b.block_table.block_ids, b.block_hashes, b.num_computed_tokens) == ([], [], 0)
    assert kv.pool.num_free_blocks == free and refs(kv)[:2] == [0, 0]
    kv.hold(hit)  # a policy took it, then left b waiting: it goes back
    assert kv.pool.num_free_blocks == free - 2
    kv.release(hit)
    assert kv.pool.num_free_blocks == free and refs(kv)[:2] == [0, 0]


def test_can_admit_counts_the_hits_it_revives():
    kv = manager(num_blocks=3, caching=True)
    written(kv, range(1, 10))  # 3 free blocks, 0 and 1 cached
    b = seq([*range(1, 9), 20, 21, 22, 23, 24])  # 8 hit + 5 new tokens: 2 new blocks
    hit = kv.get_computed_blocks(b, transaction(kv))
    assert not kv.can_admit([b], [hit], [5])  # 2 revived + 2 grown > 3 free
    assert kv.can_admit([b], [hit], [4])  # 2 revived + 1 grown
    assert kv.can_admit([b, b], [hit, hit], [4, 0])  # the same hits revive once


def test_a_prefix_hit_always_leaves_the_last_token_to_compute():
    kv = manager(caching=True)
    written(kv, range(1, 10))
    whole = seq(range(1, 9))  # exactly the two cached blocks
    assert admit(kv, whole) == 4  # block 1 holds the last token: it is computed again
    assert whole.block_table.block_ids == [0]


def test_a_prefix_hit_misses_on_other_tokens_and_needs_caching():
    kv = manager(caching=True)
    written(kv, range(1, 10))
    assert admit(kv, seq([9, *range(2, 10)])) == 0  # first block differs: nothing after it
    plain = manager(caching=False)
    written(plain, range(1, 10))
    assert admit(plain, seq(range(1, 10))) == 0 and plain.stats()["cached_blocks"] == 0


def test_a_block_is_published_when_the_step_that_fills_it_commits():
    kv = manager(caching=True)
    a = seq(range(1, 11))
    admit(kv, a)
    step(kv, a, 3)
    assert kv.stats()["cached_blocks"] == 0  # block 0 holds 3 of 4 tokens
    tx = transaction(kv)
    step(kv, a, 3, tx=tx)
    assert kv.stats()["cached_blocks"] == 0  # staged, not cached
    assert [b.block_hash for b in tx.staged] == a.block_hashes[:1]
    tx.commit()  # the forward wrote block 0's K/V
    assert kv.stats()["cached_blocks"] == 1  # block 0 full after this step, block 1 not
    assert pool_view(kv)[1][:2] == [True, False]
    assert a.block_hashes == chain_hashes(list(range(1, 5)), BS)


def test_a_failed_step_publishes_nothing():
    kv = manager(caching=True)
    written(kv, range(1, 5))  # block 0 published by a step that succeeded
    a = seq(range(1, 14))
    assert admit(kv, a) == 4
    tx = transaction(kv)
    step(kv, a, 9, tx=tx)  # fills blocks 1, 2 (full once the step runs), block 3 partial
    assert a.block_table.block_ids == [0, 1, 2, 3] and len(tx.staged) == 2
    tx.rollback()  # the step failed
    assert kv.stats()["cached_blocks"] == 1 and not tx.staged
    assert pool_view(kv)[1][:4] == [True, False, False, False]
    assert [kv.pool.blocks[b].block_hash is None for b in (1, 2)] == [True, True]
    late = seq(range(1, 14))
    assert admit(kv, late) == 4  # only the block written by the earlier step is a hit


def test_mark_written_records_the_peak():
    kv = manager(caching=True)
    a = seq(range(1, 10))
    admit(kv, a)
    step(kv, a, 9)
    assert kv.peak_slots_allocated == 0  # updated only once the step ran
    kv.mark_written()
    assert kv.peak_slots_allocated == 12 and kv.slots_allocated() == 12
    assert kv.stats()["cached_blocks"] == 2
    kv.free(a)
    kv.mark_written()
    assert kv.slots_allocated() == 0 and kv.peak_slots_allocated == 12
    assert pool_view(kv) == ([0] * 8, [True, True] + [False] * 6, 8)  # cached blocks stay cached


def test_a_request_admitted_later_in_the_step_shares_what_it_stages():
    kv = manager(caching=True)
    a, b = seq(range(1, 10)), seq(range(1, 10))
    tx = transaction(kv)
    admit(kv, a, tx)
    step(kv, a, 9, tx=tx)  # same step: a fills blocks 0, 1 ...
    assert admit(kv, b, tx) == 8  # ... and b, admitted after it, shares them (staged, not yet cached)
    assert kv.stats()["cached_blocks"] == 0 and refs(kv)[:3] == [2, 2, 1]
    tx.commit()
    assert kv.stats()["cached_blocks"] == 2


def test_a_hit_on_a_staged_block_goes_with_a_failed_step():
    kv = manager(caching=True)
    a, b = seq(range(1, 10)), seq(range(1, 10))
    tx = transaction(kv)
    admit(kv, a, tx)
    step(kv, a, 9, tx=tx)
    assert admit(kv, b, tx) == 8
    tx.rollback()
    assert kv.stats()["cached_blocks"] == 0
    assert refs(kv)[:3] == [2, 2, 1]  # b keeps its references until the scheduler frees it
    assert admit(kv, seq(range(1, 10))) == 0


def test_a_staged_block_must_continue_the_hit_before_it():
    kv = manager(caching=True)
    written(kv, range(1, 5))  # block 0 cached: tokens 1-4
    a = seq([*range(1, 5), *range(5, 9), 30])
    tx = transaction(kv)
    admit(kv, a, tx)
    step(kv, a, 5, tx=tx)  # stages block 1 (tokens 5-8) after cached block 0
    other = seq([*range(11, 15), *range(5, 9), 31])  # same second block after another first one
    assert admit(kv, other, tx) == 0
    assert admit(kv, seq([*range(1, 9), 32]), tx) == 8


def test_evicting_a_cached_block_counts():
    kv = manager(num_blocks=3, caching=True)
    written(kv, range(1, 10))  # 3 blocks, 2 cached, all free
    big = seq(range(100, 112))
    assert admit(kv, big) == 0
    step(kv, big, 12)  # takes every block, the 2 cached ones included
    assert kv.stats()["prefix_evictions"] == 2
    assert admit(kv, seq(range(1, 10))) == 0


# -- swapping ------------------------------------------------------------------------------
def test_swap_out_moves_a_unit_to_the_host_pool_keeping_its_sharing():
    kv = manager(host=4)
    other = seq(range(90, 94))
    step(kv, other, 4)  # block 0
    parent, child = forked_pair(kv)  # share [1, 2]
    step(kv, child, 1)  # copy-on-write: child [1, 3]
    step(kv, parent, 1)
    unit = [parent, child]
    assert kv.can_swap_out(unit) and not manager().can_swap_out(unit)
    pairs = kv.swap_out(unit)
    assert pairs == [(1, 0), (2, 1), (3, 2)]  # device -> host, one per distinct block
    assert parent.block_table.block_ids == [0, 1] and child.block_table.block_ids == [0, 2]
    assert refs(kv, kv.host_pool) == [2, 1, 1, 0]
    assert refs(kv) == [1, 0, 0, 0, 0, 0, 0, 0] and kv.pool.num_free_blocks == 7
    assert kv.stats()["swapped_out_blocks"] == 3
    assert kv.tokens_held([other]) == 4


def test_can_swap_out_needs_room_for_every_distinct_block():
    kv = manager(host=2)
    parent, child = forked_pair(kv)
    step(kv, child, 1)  # 3 distinct blocks: [0, 1] and [0, 2]
    assert not kv.can_swap_out([parent, child])
    assert kv.can_swap_out([parent])


def test_swap_in_brings_the_unit_back_and_free_uses_the_right_pool():
    kv = manager(host=4)
    parent, child = forked_pair(kv)
    step(kv, child, 1)
    step(kv, parent, 1)
    unit = [parent, child]
    kv.swap_out(unit)  # host [0, 1] and [0, 2]
    taken = seq(range(20))
    step(kv, taken, 20)  # 5 of the 8 device blocks: 3 free
    assert kv.can_swap_in(unit, [1, 1])  # 3 distinct blocks, the next tokens fit in them
    assert not kv.can_swap_in(unit, [2, 1])  # the parent's 9th token needs a 4th block
    pairs = kv.swap_in(unit)
    # host -> device, into the blocks the swap-out freed (tail first: 1, 2, then the shared 0)
    assert pairs == [(0, 1), (1, 2), (2, 0)]
    assert parent.block_table.block_ids == [1, 2] and child.block_table.block_ids == [1, 0]
    assert refs(kv)[:3] == [1, 2, 1] and refs(kv, kv.host_pool) == [0, 0, 0, 0]
    assert kv.stats()["swapped_in_blocks"] == 3
    kv.free(child)
    kv.free(parent)
    assert refs(kv) == [0, 0, 0, 1, 1, 1, 1, 1]  # only ``taken`` holds blocks


def test_freeing_a_swapped_out_sequence_gives_back_host_blocks():
    kv = manager(host=4)
    parent, child = forked_pair(kv)
    kv.swap_out([parent, child])
    kv.free(parent)
    assert refs(kv, kv.host_pool) == [1, 1, 0, 0] and kv.pool.num_free_blocks == 8
    kv.free(child)
    assert kv.host_pool.num_free_blocks == 4 and kv.pool.num_free_blocks == 8


# -- figures -------------------------------------------------------------------------------
def test_refuse_names_the_blocks_and_the_pool():
    kv = manager(num_blocks=8)
    assert kv.refuse(33, 1) is None  # 32 stored tokens: 8 blocks
    assert kv.refuse(34, 1) == "needs 9 blocks of 4 tokens but the whole pool has 8"
    assert kv.refuse(17, 2) is None
    assert kv.refuse(18, 2) == "needs 10 blocks of 4 tokens but the whole pool has 8"


def test_tokens_held_counts_a_shared_slot_once():
    kv = manager()
    parent, child = forked_pair(kv)
    assert kv.tokens_held([parent, child]) == 6 and kv.slots_allocated() == 8
    step(kv, child, 1)
    step(kv, parent, 1)
    assert kv.tokens_held([parent, child]) == 4 + 3 + 3  # block 0 shared, blocks 1 and 2 own
    assert kv.slots_allocated() == 12
    assert kv.tokens_held([parent]) == 7 and kv.tokens_held([]) == 0


def test_stats_and_pool_view():
    kv = manager(caching=True)
    parent = seq(range(1, 7))
    admit(kv, parent)
    step(kv, parent, 6, sampled=50)
    child = seq(range(1, 7))
    kv.fork(parent, child)
    child.num_computed_tokens = 6
    child.token_ids.append(51)
    step(kv, child, 1)
    assert kv.stats() == dict(
        num_free_blocks=5,
        blocks_saved=1,
        cached_blocks=1,
        prefix_evictions=0,
        cow_copies=1,
        swapped_out_blocks=0,
        swapped_in_blocks=0,
    )
    assert pool_view(kv) == ([2, 1, 1, 0, 0, 0, 0, 0], [True] + [False] * 7, 5)


def test_block_ids_are_the_blocks_of_the_first_tokens_and_a_copy():
    kv = manager()
    s = seq(range(1, 10))  # 9 tokens: 3 blocks of 4
    step(kv, s, 9)
    table = s.block_table.block_ids
    assert kv.block_ids(s, 9) == table and len(table) == 3
    assert kv.block_ids(s, 8) == table[:2] and kv.block_ids(s, 1) == table[:1]
    ids = kv.block_ids(s, 9)
    step(kv, s, 4)  # the table grows by one block; what was handed out before does not
    assert len(s.block_table.block_ids) == 4 and ids == table[:3] and len(ids) == 3


def test_one_door_both_layouts_answer_every_verb():
    """The scheduler's one door to memory (KVCacheManager): both layouts answer every verb, so the
    scheduler never asks which one it has. The contiguous layout answers the paged extras as a
    layout that shares nothing: no computed blocks, no room to swap, no fork."""
    from typing_extensions import get_protocol_members

    from minipaged.engine.contiguous_manager import ContiguousKVManager
    from minipaged.engine.kv_cache_manager import KVCacheManager
    from minipaged.engine.prefix_hit import PrefixHit

    verbs = get_protocol_members(KVCacheManager)
    assert {"get_computed_blocks", "allocate_slots", "free", "fork", "swap_out", "swap_in"} <= verbs
    contiguous = ContiguousKVManager(64, BS, 32)
    for name in verbs:
        assert hasattr(contiguous, name) and hasattr(manager(), name), name
    s = seq(range(1, 10))
    assert contiguous.get_computed_blocks(s, transaction(contiguous)) == PrefixHit()
    assert not contiguous.can_swap_out([s]) and not contiguous.can_swap_in([s], [1])
    assert contiguous.attach(s, PrefixHit()) == 0 and contiguous.prefix_cache is None
    with pytest.raises(RuntimeError, match="paged"):
        contiguous.fork(s, seq(range(1, 10)))
