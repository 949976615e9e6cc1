"""Reference solutions for stage 1 (notebook 01_block_allocator)."""

from __future__ import annotations

from collections import deque


class TinyPool:
    """The notebook's dozen-line pool (a copy of the one in ``exercises/stage1_allocator.py``)."""

    def __init__(self, num_blocks):
        self.free_list = deque(range(num_blocks))
        self.ref_cnt = [0] * num_blocks

    def allocate(self, n):
        if n > len(self.free_list):
            raise RuntimeError(f"asked for {n} blocks, only {len(self.free_list)} free")
        ids = [self.free_list.popleft() for _ in range(n)]
        for block_id in ids:
            self.ref_cnt[block_id] = 1
        return ids

    def share(self, block_id):
        assert self.ref_cnt[block_id] > 0, "only a block in use can be shared"
        self.ref_cnt[block_id] += 1

    def free(self, ids):
        for block_id in reversed(ids):  # tail first
            self.ref_cnt[block_id] -= 1
            if self.ref_cnt[block_id] == 0:
                self.free_list.append(block_id)


class LifoPool(TinyPool):
    """A ``TinyPool`` whose free list is a stack: the block freed last is handed out first."""

    def free(self, ids):
        for block_id in reversed(ids):  # tail first, so the head block is freed last ...
            self.ref_cnt[block_id] -= 1
            if self.ref_cnt[block_id] == 0:
                self.free_list.appendleft(block_id)  # ... and handed out first


def fork(pool, block_ids: list[int]) -> list[int]:
    """The child's block list: the parent's blocks, one more reference each."""
    for block_id in block_ids:
        pool.share(block_id)
    return list(block_ids)
