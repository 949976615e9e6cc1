"""A waiting sequence's cached prefix, found without changing anything (:class:`PrefixHit`).

The KV manager finds it (:meth:`get_computed_blocks
<minipaged.engine.kv_cache_manager.KVCacheManager.get_computed_blocks>`), the scheduler decides
whether the sequence is admitted, and only then are its blocks taken (``hold``, ``attach``). A
layout that caches nothing finds an empty one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.kv.kv_cache_block import KVCacheBlock


@dataclass
class PrefixHit:
    """``block_hashes`` of a sequence's full blocks, and ``blocks``, the cached (or staged) blocks
    of its longest cached prefix."""

    block_hashes: list[int] = field(default_factory=list)
    blocks: list[KVCacheBlock] = field(default_factory=list)
