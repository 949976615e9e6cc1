"""Stage 1: the block pool, its free queue and its errors."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from minipaged.kv.block_pool import BlockPool, BlockPoolError, FreeBlockQueue, NoFreeBlocksError
from minipaged.kv.cached_blocks import CachedEntry
from minipaged.kv.kv_cache_block import KVCacheBlock


def snapshot(pool: BlockPool) -> tuple:
    """Everything observable about a pool: ref counts, hashes and free-queue order."""
    return ([(b.ref_cnt, b.block_hash) for b in pool.blocks], [b.block_id for b in pool.free_queue])


# ---- FreeBlockQueue --------------------------------------------------------------------------


def test_queue_order_popleft_append_remove():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert [b.block_id for b in q] == [0, 1, 2, 3, 4] and len(q) == 5
    assert q.popleft() is blocks[0]
    q.remove(blocks[2])  # from the middle
    q.append(blocks[0])
    assert [b.block_id for b in q] == [1, 3, 4, 0] and len(q) == 4
    assert blocks[2] not in q and blocks[0] in q


def test_queue_errors():
    a, b = KVCacheBlock(0), KVCacheBlock(1)
    q = FreeBlockQueue([a])
    with pytest.raises(BlockPoolError, match="already in the free queue"):
        q.append(a)
    with pytest.raises(BlockPoolError, match="not in the free queue"):
        q.remove(b)
    q.popleft()
    with pytest.raises(IndexError, match="empty"):
        q.popleft()


def test_queue_ops_are_constant_time():
    """Removing from the middle of a 200k-long queue touches as many links as in a 200-long one
    (counted, not timed: a linear remove would walk ~1000x more links)."""

    class CountingBlock(KVCacheBlock):
        touches = 0

        def __getattribute__(self, name: str) -> object:
            if name in ("prev_free_block", "next_free_block"):
                CountingBlock.touches += 1
            return super().__getattribute__(name)

    def cost(n: int) -> int:
        blocks = [CountingBlock(i) for i in range(n)]
        q = FreeBlockQueue(blocks)
        middle = blocks[n // 2 - 100 : n // 2 + 100]
        CountingBlock.touches = 0
        for _ in range(20):
            for b in middle:
                q.remove(b)
            for b in middle:
                q.append(b)
            q.append(q.popleft())
        return CountingBlock.touches

    assert cost(200) == cost(200_000) > 0


def test_block_repr_hides_links():
    q = FreeBlockQueue([KVCacheBlock(0), KVCacheBlock(1)])
    assert repr(next(iter(q))) == "KVCacheBlock(block_id=0, ref_cnt=0, block_hash=None)"


# ---- BlockPool -------------------------------------------------------------------------------


def test_allocate_free_share_counts():
    pool = BlockPool(8)
    blocks = pool.allocate(3)
    assert [b.block_id for b in blocks] == [0, 1, 2] and all(b.ref_cnt == 1 for b in blocks)
    assert (pool.num_free_blocks, pool.num_used_blocks, pool.usage) == (5, 3, 3 / 8)
    pool.share(blocks[1])
    pool.free(blocks)
    assert [b.ref_cnt for b in blocks] == [0, 1, 0]
    assert pool.num_free_blocks == 7
    pool.free([1])  # ids work too
    assert pool.num_free_blocks == 8
    pool.check_invariants()


def test_free_appends_in_reverse_so_tail_goes_first():
    pool = BlockPool(6)
    request = pool.allocate(3)  # blocks 0, 1, 2 in logical order
    pool.free(request)
    assert [b.block_id for b in pool.free_queue] == [3, 4, 5, 2, 1, 0]
    assert [b.block_id for b in pool.allocate(3)] == [3, 4, 5]
    assert [b.block_id for b in pool.allocate(1)] == [2]  # the old tail is reused before the head


def test_allocate_is_all_or_nothing_with_a_clear_message():
    pool = BlockPool(8)
    pool.allocate(5)
    before = snapshot(pool)
    with pytest.raises(NoFreeBlocksError, match=r"^asked for 5 blocks, only 3 free of 8$"):
        pool.allocate(5)
    assert snapshot(pool) == before
    assert len(pool.allocate(0)) == 0


@pytest.mark.parametrize("bad", [-1, 1.0, "2", True, None])
def test_allocate_rejects_bad_counts(bad):
    pool = BlockPool(4)
    with pytest.raises(ValueError, match="non-negative int"):
        pool.allocate(bad)
    assert pool.num_free_blocks == 4


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_pool_size_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="positive int"):
        BlockPool(bad)


def test_errors_leave_the_pool_unchanged():
    pool, other = BlockPool(4), BlockPool(4)
    a, b = pool.allocate(2)
    pool.share(b)  # b.ref_cnt == 2
    before = snapshot(pool)
    cases = [
        (lambda: pool.free([a, pool.blocks[3]]), "block 3 is already free"),
        (lambda: pool.free([a, a]), "block 0 freed 2 times but its ref_cnt is 1"),
        (lambda: pool.free([b, b, b]), "block 1 freed 3 times but its ref_cnt is 2"),
        (lambda: pool.free([a, 9]), r"unknown block id 9 \(pool has blocks 0..3\)"),
        (lambda: pool.free([a, -1]), "unknown block id -1"),
        (lambda: pool.free([a, other.blocks[2]]), "block 2 does not belong to this pool"),
        (lambda: pool.share(pool.blocks[2]), "cannot share block 2: it is free"),
        (lambda: pool.share(7), "unknown block id 7"),
    ]
    for call, message in cases:
        with pytest.raises(BlockPoolError, match=message):
            call()
        assert snapshot(pool) == before, message
        pool.check_invariants()
    pool.free([b, b])  # twice is fine when ref_cnt is 2
    assert b.ref_cnt == 0


def test_check_invariants_catches_corruption():
    pool = BlockPool(4)
    (a,) = pool.allocate(1)
    a.ref_cnt = 0  # neither free nor used
    with pytest.raises(AssertionError, match="block 0 is outside the free queue with ref_cnt 0"):
        pool.check_invariants()
    a.ref_cnt = 1
    pool.blocks[2].ref_cnt = 1  # in the queue but counted as used
    with pytest.raises(AssertionError, match="block 2 is in the free queue with ref_cnt 1"):
        pool.check_invariants()
    pool.blocks[2].ref_cnt = 0
    pool.check_invariants()
    pool.blocks[3].next_free_block = pool.blocks[1]  # a cycle 1 -> 2 -> 3 -> 1
    with pytest.raises(AssertionError, match="block 1 is in the free queue twice"):
        pool.check_invariants()


def test_the_pool_evicts_a_reused_cached_block_from_its_map():
    pool = BlockPool(3)
    blocks = pool.allocate(2)
    entry = CachedEntry((1, 2), None)
    pool.cached_blocks.add(blocks[0], 1234, entry)  # as stage 6 publishes a full block
    assert blocks[0].block_hash == 1234 and pool.cached_blocks.blocks == {1234: blocks[0]}
    pool.free(blocks)  # queue: 2, 1, 0
    pool.touch(pool.blocks[1])  # a cache hit revives a free block from the middle
    assert pool.blocks[1].ref_cnt == 1 and [b.block_id for b in pool.free_queue] == [2, 0]
    pool.touch(pool.blocks[1])
    assert pool.blocks[1].ref_cnt == 2
    assert pool.cached_blocks.num_evictions == 0 and pool.cached_blocks.entries == {0: entry}
    pool.allocate(2)  # takes block 2, then block 0, which still holds hash 1234
    cached = pool.cached_blocks
    assert cached.blocks == {} and cached.entries == {} and cached.num_evictions == 1
    assert pool.blocks[0].block_hash is None
    pool.check_invariants()


# ---- random sequences of operations against a model -------------------------------------------


class PoolMachine(RuleBasedStateMachine):
    """A pool driven by random allocate / share / free calls, compared with a dict of ref counts."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(12)
        self.expected: dict[int, int] = {}  # block_id -> expected ref_cnt, only blocks in use
        self.held: list[int] = []  # outstanding references (block ids, with repeats)

    @rule(n=st.integers(0, 14))
    def allocate(self, n):
        free_before = self.pool.num_free_blocks
        if n > free_before:
            with pytest.raises(NoFreeBlocksError):
                self.pool.allocate(n)
            return
        ids = [b.block_id for b in self.pool.allocate(n)]
        assert len(set(ids)) == n
        assert not set(ids) & set(self.expected), "a block in use was handed out again"
        for i in ids:
            self.expected[i] = 1
        self.held += ids

    @rule(pick=st.integers(0, 10_000))
    def share(self, pick):
        if not self.held:
            return
        block_id = self.held[pick % len(self.held)]
        self.pool.share(block_id)
        self.expected[block_id] += 1
        self.held.append(block_id)

    @rule(picks=st.lists(st.integers(0, 10_000), max_size=5, unique=True))
    def free_some(self, picks):
        chosen = sorted({p % len(self.held) for p in picks}, reverse=True) if self.held else []
        ids = [self.held.pop(i) for i in chosen]
        self.pool.free(ids)
        for i in ids:
            self.expected[i] -= 1
            if self.expected[i] == 0:
                del self.expected[i]

    @rule(block_id=st.integers(0, 11), extra=st.integers(1, 3))
    def overfree_is_rejected(self, block_id, extra):
        before = snapshot(self.pool)
        with pytest.raises(BlockPoolError):
            self.pool.free([block_id] * (self.expected.get(block_id, 0) + extra))
        assert snapshot(self.pool) == before

    @invariant()
    def matches_model(self):
        self.pool.check_invariants()
        assert {b.block_id: b.ref_cnt for b in self.pool.blocks if b.ref_cnt} == self.expected
        assert self.pool.num_free_blocks == 12 - len(self.expected)
        assert sorted(self.held) == sorted(i for i, n in self.expected.items() for _ in range(n))

    def teardown(self):
        # Releasing every outstanding reference returns the pool to full: nothing leaked.
        self.pool.free(self.held)
        assert self.pool.num_free_blocks == 12
        self.pool.check_invariants()


PoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)
TestPoolMachine = pytest.mark.slow(PoolMachine.TestCase)
