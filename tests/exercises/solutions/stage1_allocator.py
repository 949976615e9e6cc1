"""Reference solutions for stage 1 (notebook 01_block_allocator)."""

from __future__ import annotations

from exercises.stage1_allocator import TinyPool  # the notebook's pool, shared with the stub


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
