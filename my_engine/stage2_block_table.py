"""Stage 2 (notebook 02): a block table maps a sequence's logical blocks to physical ones.

Check: the last cell of notebook 02, or ``python -m exercises my_engine 2``. ``pool`` is a block
pool as in stage 1 (``allocate(n)`` returns ``KVCacheBlock``\\s, ``blocks[i]`` is block ``i``).
"""

from __future__ import annotations

from typing import Any


class BlockTable:
    """``block_ids[j]``: the physical block of logical block ``j``; ``num_tokens``: tokens the sequence holds."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.block_ids: list[int] = []
        self.num_tokens = 0

    def append_tokens(self, num_new_tokens: int, pool: Any) -> list[int]:
        """**core** — make room for ``num_new_tokens`` more tokens; return the ids of the blocks taken.

        A block is taken only when the tokens do not fit the last one: after the call the table
        holds ``cdiv(num_tokens, block_size)`` blocks.
        """
        raise NotImplementedError("BlockTable.append_tokens: allocate the missing blocks, count the tokens")

    def physical(self, pos: int) -> tuple[int, int]:
        """**core** — ``(block_id, offset)`` of token ``pos``; ``IndexError`` unless ``0 <= pos < num_tokens``."""
        raise NotImplementedError("BlockTable.physical: block_ids[pos // block_size], pos % block_size")

    def free(self, pool: Any) -> None:
        """**stretch** — give every block back to ``pool`` and empty the table.

        Pass the blocks in logical order: the pool frees them tail first."""
        raise NotImplementedError("BlockTable.free: pool.free(the table's blocks), then no blocks, no tokens")
