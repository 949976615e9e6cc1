"""Stage 2: block tables, one sequence's map from logical blocks to physical blocks.

Token ``pos`` of a sequence lives in logical block ``pos // block_size`` at offset
``pos % block_size``; the block table says which physical block that logical block is. Like a
page table, it lets a sequence's memory be scattered anywhere in the pool and grow one block
at a time, so only the last block can be partly empty.

Example (block size 16): sequence A holds 24 tokens in physical blocks ``[7, 3]``: tokens
0-15 fill block 7, tokens 16-23 sit in block 3, which has 8 free slots left.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minipaged.kv.block_pool import KVBlockPool
from minipaged.utils import cdiv


class BlockTable:
    """The physical block ids of one sequence, in logical order, and how many tokens it holds."""

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.block_ids: list[int] = []
        self.num_tokens = 0

    @classmethod
    def from_blocks(cls, block_ids: Sequence[int], num_tokens: int, block_size: int) -> BlockTable:
        """A table written by hand (for teaching and tests): no pool is involved.

        ``block_ids`` must be exactly the blocks ``num_tokens`` tokens need, as a grown table would be.
        """
        table = cls(block_size)
        table.add_blocks(block_ids, num_tokens)
        return table

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ceil(num_tokens / block_size)."""
        return cdiv(num_tokens, self.block_size)

    def slots_needed(self, num_tokens: int) -> int:
        """Slots that ``num_tokens`` tokens occupy, the unused tail of the last block included."""
        return self.num_blocks_needed(num_tokens) * self.block_size

    def new_blocks_needed(self, num_new_tokens: int) -> int:
        """Blocks that appending ``num_new_tokens`` tokens would allocate (0 while the last block has room)."""
        return self.num_blocks_needed(self.num_tokens + num_new_tokens) - len(self.block_ids)

    def append_tokens(self, num_new_tokens: int, pool: KVBlockPool) -> list[int]:
        """Make room for ``num_new_tokens`` more tokens; return the ids of newly allocated blocks.

        All or nothing: if the pool is short, :class:`~minipaged.kv.block_pool.NoFreeBlocksError`
        propagates and the table is unchanged.
        """
        if num_new_tokens < 0:
            raise ValueError(f"cannot append {num_new_tokens} tokens")
        new_ids = [block.block_id for block in pool.allocate(self.new_blocks_needed(num_new_tokens))]
        self.block_ids += new_ids
        self.num_tokens += num_new_tokens
        return new_ids

    def add_blocks(self, block_ids: Sequence[int], num_tokens: int) -> None:
        """Append blocks the caller already holds a reference to, covering ``num_tokens`` more tokens.

        For blocks that come filled: prefix-cache hits, or a parent's blocks shared with a fork.
        The table's last block must be full (or the table empty), or positions would not line up.
        """
        if self.num_tokens != len(self.block_ids) * self.block_size:
            raise ValueError(f"cannot add blocks after a partly filled block ({self!r})")
        if self.num_blocks_needed(num_tokens) != len(block_ids):
            raise ValueError(
                f"{num_tokens} tokens need {self.num_blocks_needed(num_tokens)} blocks of {self.block_size}, "
                f"got {len(block_ids)}"
            )
        self.block_ids += block_ids
        self.num_tokens += num_tokens

    def physical(self, pos: int) -> tuple[int, int]:
        """(physical block id, offset in that block) of token position ``pos``."""
        if not 0 <= pos < self.num_tokens:
            raise IndexError(f"position {pos} is outside the sequence's {self.num_tokens} tokens")
        return self.block_ids[pos // self.block_size], pos % self.block_size

    def free(self, pool: KVBlockPool) -> None:
        """Give every block back to the pool (shared blocks just lose one reference); the table empties."""
        pool.free(self.block_ids)
        self.block_ids = []
        self.num_tokens = 0

    def __repr__(self) -> str:
        return f"BlockTable({self.block_ids}, tokens={self.num_tokens})"


def padded_block_tables(
    block_tables: Sequence[Sequence[int]], pad: int = 0, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """int32 [num_seqs, max_blocks]: ragged block tables padded on the right with ``pad``.

    Kernels want one rectangular tensor. The padding value is never read, because attention
    stops at each sequence's ``context_len``; 0 is a valid block id, so even a kernel that
    wrongly read it would stay in bounds instead of faulting.
    """
    width = max((len(t) for t in block_tables), default=0)
    rows = [list(t) + [pad] * (width - len(t)) for t in block_tables]
    return torch.tensor(rows, dtype=torch.int32, device=device).reshape(len(rows), width)
