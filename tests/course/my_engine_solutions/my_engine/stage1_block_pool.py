"""Stage 1 (notebook 01): a pool of fixed-size blocks, a free queue and reference counts."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass


class NoFreeBlocksError(RuntimeError):
    """Fewer free blocks than asked for."""


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None


class BlockPool:
    def __init__(self, num_blocks: int, on_evict: Callable[[KVCacheBlock], None] | None = None) -> None:
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue: deque[KVCacheBlock] = deque(self.blocks)
        self.on_evict = on_evict

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def allocate(self, n: int) -> list[KVCacheBlock]:
        if n > len(self.free_block_queue):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self.free_block_queue)} free")
        blocks = [self.free_block_queue.popleft() for _ in range(n)]
        for block in blocks:
            if block.block_hash is not None:
                if self.on_evict is not None:
                    self.on_evict(block)
                block.block_hash = None
            block.ref_cnt = 1
        return blocks

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        blocks = list(blocks)
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} is already free")
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def share(self, block: KVCacheBlock) -> None:
        if block.ref_cnt <= 0:
            raise ValueError(f"block {block.block_id} is free: nothing to share")
        block.ref_cnt += 1

    def touch(self, block: KVCacheBlock) -> None:
        if block.ref_cnt == 0:
            self.free_block_queue.remove(block)
        block.ref_cnt += 1
