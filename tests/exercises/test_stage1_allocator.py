"""Stage 1 exercises: ``LifoPool`` and ``fork`` (notebook 01)."""

from __future__ import annotations

import pytest

from exercises.stage1_allocator import TinyPool
from minipaged.kv.block_pool import BlockPool

STAGE = "stage1_allocator"


def script(pool):
    """Notebook 01's script of operations; yields (operation, ids returned) after each."""
    held = {}
    held["A"] = pool.allocate(3)
    yield "A = allocate(3)", held["A"]
    held["B"] = pool.allocate(2)
    yield "B = allocate(2)", held["B"]
    pool.share(held["A"][0])
    yield "C shares A's block 0", None
    pool.free(held.pop("A"))
    yield "free(A)", None
    held["D"] = pool.allocate(6)
    yield "D = allocate(6)", held["D"]
    pool.free(held.pop("B"))
    yield "free(B)", None
    held["E"] = pool.allocate(2)
    yield "E = allocate(2)", held["E"]


# Worked out by hand: a stack hands back the block freed last, and `free` walks tail first.
LIFO_SCRIPT = [
    ("A = allocate(3)", [0, 1, 2], [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]),
    ("B = allocate(2)", [3, 4], [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]),
    ("C shares A's block 0", None, [2, 1, 1, 1, 1, 0, 0, 0, 0, 0]),
    ("free(A)", None, [1, 0, 0, 1, 1, 0, 0, 0, 0, 0]),
    ("D = allocate(6)", [1, 2, 5, 6, 7, 8], [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]),
    ("free(B)", None, [1, 1, 1, 0, 0, 1, 1, 1, 1, 0]),
    ("E = allocate(2)", [3, 4], [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]),
]


@pytest.mark.exercise("LifoPool")
def test_lifo_pool_script(ex):
    pool = ex.LifoPool(10)
    for (op, got), (want_op, want, want_ref) in zip(script(pool), LIFO_SCRIPT):
        assert op == want_op
        assert got == want, f"{op}: a stack hands out {want}, got {got}"
        assert list(pool.ref_cnt) == want_ref, f"{op}: ref_cnt should be {want_ref}, got {list(pool.ref_cnt)}"
        free = {i for i, r in enumerate(want_ref) if r == 0}
        assert sorted(pool.free_list) == sorted(free), f"{op}: the free list should hold {sorted(free)}"


@pytest.mark.exercise("LifoPool")
def test_lifo_pool_order(ex):
    pool = ex.LifoPool(6)
    assert pool.allocate(2) == [0, 1], "a fresh pool hands out 0, 1, ... first"
    a, b = pool.allocate(2), pool.allocate(1)  # [2, 3], [4]
    pool.free(a)  # tail first: 3 then 2, so 2 is on top
    pool.free(b)  # 4 is now on top
    assert pool.allocate(1) == [4], "the block freed last is handed out first"
    assert pool.allocate(3) == [2, 3, 5]
    with pytest.raises(RuntimeError):
        pool.allocate(1)
    pool.free([0, 1])
    before = (sorted(pool.free_list), list(pool.ref_cnt))
    with pytest.raises(RuntimeError):
        pool.allocate(3)
    assert (sorted(pool.free_list), list(pool.ref_cnt)) == before, "a failed allocate must change nothing"
    assert pool.allocate(2) == [0, 1]


@pytest.mark.exercise("LifoPool")
def test_lifo_differs_from_fifo(ex):
    """The same script on the package's BlockPool (FIFO, vLLM's order) gives D different blocks."""
    fifo = dict((op, got) for op, got in script(_IdPool(BlockPool(10))))
    lifo = dict((op, got) for op, got in script(ex.LifoPool(10)))
    assert fifo["D = allocate(6)"] == [5, 6, 7, 8, 9, 2]
    assert lifo["D = allocate(6)"] != fifo["D = allocate(6)"]


class _IdPool:
    """BlockPool with ids in and out, like TinyPool."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool

    def allocate(self, n):
        return [b.block_id for b in self.pool.allocate(n)]

    def share(self, block_id):
        self.pool.share(block_id)

    def free(self, ids):
        self.pool.free(ids)


@pytest.mark.exercise("fork")
def test_fork_shares_every_block(ex):
    pool = BlockPool(8)
    parent = [b.block_id for b in pool.allocate(3)]
    free_before = pool.num_free_blocks
    child = ex.fork(pool, parent)
    assert child == parent, f"the child maps its logical blocks to the parent's blocks {parent}, got {child}"
    assert child is not parent, "return a new list: the child's table will grow on its own"
    assert pool.num_free_blocks == free_before, "fork allocates no block"
    assert [pool.blocks[i].ref_cnt for i in parent] == [2, 2, 2], "one more reference to each block"
    grandchild = ex.fork(pool, child)
    assert [pool.blocks[i].ref_cnt for i in parent] == [3, 3, 3]
    pool.free(parent)
    assert [pool.blocks[i].ref_cnt for i in parent] == [2, 2, 2]
    assert pool.num_free_blocks == free_before, "freeing the parent leaves the children's blocks in use"
    pool.free(child)
    pool.free(grandchild)
    assert pool.num_free_blocks == 8
    pool.check_invariants()


@pytest.mark.exercise("fork")
def test_fork_then_grow(ex):
    """A fork's table grows on its own: the parent's list is untouched."""
    pool = BlockPool(6)
    parent = [b.block_id for b in pool.allocate(2)]
    child = ex.fork(pool, parent)
    child.append(pool.allocate(1)[0].block_id)
    assert parent == [0, 1] and child == [0, 1, 2]
    pool.free(child)
    assert [pool.blocks[i].ref_cnt for i in (0, 1, 2)] == [1, 1, 0]
    pool.check_invariants()


@pytest.mark.exercise("fork")
def test_fork_on_tiny_pool(ex):
    pool = TinyPool(4)
    parent = pool.allocate(2)
    child = ex.fork(pool, parent)
    assert child == parent and pool.ref_cnt[:2] == [2, 2] and len(pool.free_list) == 2
    pool.free(parent)
    assert pool.ref_cnt[:2] == [1, 1] and len(pool.free_list) == 2
