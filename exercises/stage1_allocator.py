"""Stage 1 exercises (notebook 01_block_allocator). Check: ``python -m exercises stage1``.

Replace each ``raise NotImplementedError`` with your code. Keep the names and signatures: the
tests import them from this file.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minipaged.kv.block_pool import BlockPool


class TinyPool:
    """The notebook's dozen-line pool, copied here to build on (do not change it).

    ``free_list``: free block ids, the front (index 0) is handed out next; ``ref_cnt[i]``: users
    of block ``i``. ``allocate`` pops from the front, ``free`` walks the ids tail first and puts
    every block nobody uses any more at the back.
    """

    def __init__(self, num_blocks: int) -> None:
        self.free_list = deque(range(num_blocks))
        self.ref_cnt = [0] * num_blocks

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_list):
            raise RuntimeError(f"asked for {n} blocks, only {len(self.free_list)} free")
        ids = [self.free_list.popleft() for _ in range(n)]
        for block_id in ids:
            self.ref_cnt[block_id] = 1
        return ids

    def share(self, block_id: int) -> None:
        assert self.ref_cnt[block_id] > 0, "only a block in use can be shared"
        self.ref_cnt[block_id] += 1

    def free(self, ids: list[int]) -> None:
        for block_id in reversed(ids):  # tail first
            self.ref_cnt[block_id] -= 1
            if self.ref_cnt[block_id] == 0:
                self.free_list.append(block_id)


class LifoPool(TinyPool):
    """A ``TinyPool`` whose free list is a **stack**: the block freed last is handed out first.

    A fresh ``LifoPool(10)`` still hands out 0, 1, 2, ... first. ``free`` still walks the ids tail
    first, so after ``free([0, 1, 2])`` the next allocation returns ``[0, 1, 2]`` again (block 0
    was freed last). ``allocate(n)`` with fewer than ``n`` free blocks raises ``RuntimeError`` and
    changes nothing, as ``TinyPool``'s does.

    Run the notebook's script on it: which blocks do ``D = allocate(6)`` and ``E = allocate(2)``
    get? (The tests know.) Then: why would a prefix cache (stage 6) prefer vLLM's FIFO order?

    Hint: you only need to change where a freed block goes, or where an allocated one comes from.
    Override one method or both, and delete the stubs you do not need.
    """

    def allocate(self, n: int) -> list[int]:
        raise NotImplementedError

    def free(self, ids: list[int]) -> None:
        raise NotImplementedError


def fork(pool: BlockPool | TinyPool, block_ids: list[int]) -> list[int]:
    """Parallel sampling: a child sequence that shares every block of its parent.

    pool: a ``minipaged.kv.block_pool.BlockPool`` (or a ``TinyPool``: both have ``share(block_id)``);
    block_ids: the parent's blocks, in logical order. Returns the child's block list — a new
    list, equal to the parent's — after taking one more reference to each block. No block is
    allocated. Freeing the parent afterwards must leave every block in use (by the child).
    """
    raise NotImplementedError
