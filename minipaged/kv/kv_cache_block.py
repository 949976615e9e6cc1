"""One physical block of KV memory, in vLLM v1's vocabulary (``KVCacheBlock``).

A block counts its users in ``ref_cnt`` (several sequences may share it, stage 1), carries a
``block_hash`` while it holds a cached prefix (stage 6), and links to its neighbours while it
waits in the pool's free queue. It holds no tensors: its K/V live at rows
``block_id * block_size ..`` of the layer caches (:mod:`minipaged.kv.paged_cache`). The block pool
(:mod:`minipaged.kv.block_pool`) and the pool's map of cached blocks
(:mod:`minipaged.kv.cached_blocks`) both handle blocks, so the block is a module of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)  # identity, not field equality: two blocks are never "the same block"
class KVCacheBlock:
    """One physical block; ``block_hash`` is set by stage 6 while the block holds a cached prefix."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    # Free-queue links; both None while the block is outside the queue.
    prev_free_block: KVCacheBlock | None = field(default=None, repr=False)
    next_free_block: KVCacheBlock | None = field(default=None, repr=False)
