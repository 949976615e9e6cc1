"""Stage 1 (notebook 01): a pool of fixed-size blocks, a free queue and reference counts.

vLLM's names: ``KVCacheBlock(block_id, ref_cnt, block_hash)`` and ``BlockPool`` with its
``free_block_queue``. Check: the last cell of notebook 01, or ``python -m exercises my_engine 1``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass


class NoFreeBlocksError(RuntimeError):
    """Fewer free blocks than asked for."""


@dataclass(eq=False)
class KVCacheBlock:
    """One physical block. ``block_hash`` is stage 6's: set while the block holds a cached prefix."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None


class BlockPool:
    """Every block of the KV cache; the free ones wait in ``free_block_queue``, the next one handed out in front."""

    def __init__(self, num_blocks: int, on_evict: Callable[[KVCacheBlock], None] | None = None) -> None:
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue: deque[KVCacheBlock] = deque(self.blocks)
        self.on_evict = on_evict  # stage 6: told when a block that still has a block_hash is handed out

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def allocate(self, n: int) -> list[KVCacheBlock]:
        """**core** — take ``n`` blocks from the FRONT of the free queue, each with ``ref_cnt`` 1.

        All or nothing: with fewer than ``n`` free, raise ``NoFreeBlocksError`` and take none.
        (Stage 6 adds: a block handed out that still has a ``block_hash`` loses it, and
        ``self.on_evict(block)`` is called first when ``on_evict`` is set.)
        """
        raise NotImplementedError("BlockPool.allocate: popleft n blocks (all or nothing), ref_cnt 1 each")

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """**core** — drop one reference to each block; a block whose ``ref_cnt`` reaches 0 joins the BACK of the queue.

        ``blocks`` come in a table's logical order: walk them **tail first** (reversed), as vLLM
        does, so a request's last block is reused before its first (stage 6 keeps shared
        beginnings longest). Freeing a block whose ``ref_cnt`` is already 0 raises ``ValueError``.
        """
        raise NotImplementedError("BlockPool.free: ref_cnt - 1, tail first; at 0 append to the free queue")

    def share(self, block: KVCacheBlock) -> None:
        """**core** — one more user of a block in use (a fork): ``ref_cnt + 1``; a free block raises ``ValueError``."""
        raise NotImplementedError("BlockPool.share: ref_cnt + 1 (a free block cannot be shared)")

    def touch(self, block: KVCacheBlock) -> None:
        """**stretch** — a prefix-cache hit takes one more reference, even on a free block.

        A free block (``ref_cnt`` 0) leaves the free queue, from wherever it is; then ``ref_cnt + 1``.
        (vLLM's queue is a doubly linked list, so this is O(1); a ``deque.remove`` is fine here.)
        """
        raise NotImplementedError("BlockPool.touch: out of the free queue if free, then ref_cnt + 1")
