"""Stage 2 (notebook 02): a block table maps a sequence's logical blocks to physical ones."""

from __future__ import annotations

from typing import Any


class BlockTable:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.block_ids: list[int] = []
        self.num_tokens = 0

    def append_tokens(self, num_new_tokens: int, pool: Any) -> list[int]:
        needed = -(-(self.num_tokens + num_new_tokens) // self.block_size) - len(self.block_ids)
        new = [b.block_id for b in pool.allocate(max(needed, 0))]
        self.block_ids += new
        self.num_tokens += num_new_tokens
        return new

    def physical(self, pos: int) -> tuple[int, int]:
        if not 0 <= pos < self.num_tokens:
            raise IndexError(f"position {pos}: the table holds {self.num_tokens} tokens")
        return self.block_ids[pos // self.block_size], pos % self.block_size

    def free(self, pool: Any) -> None:
        pool.free([pool.blocks[i] for i in self.block_ids])
        self.block_ids, self.num_tokens = [], 0
