"""Stage 6's map in the pool: which blocks hold cached prefixes (vLLM's
``BlockPool.cached_block_hash_to_block``).

A full block that the prefix cache published is *cached*: its ``block_hash`` is set and
:class:`CachedBlocks` maps the hash to it. The block pool owns the map, as vLLM's ``BlockPool``
does, because the pool is where a cached block stops being one: when allocation hands a free
cached block out for new tokens, the pool evicts it from the map in the same call (vLLM's
``_maybe_evict_cached_block``). The prefix cache (:mod:`minipaged.kv.prefix_cache`) keeps the
rules, what may be published and what a lookup hits, and reads and writes this map: nothing
points up from the pool, and nothing is left for the cache to catch up on.
"""

from __future__ import annotations

from dataclasses import dataclass

from minipaged.kv.kv_cache_block import KVCacheBlock


@dataclass(frozen=True, eq=False)
class CachedEntry:
    """What a cached block holds: its tokens, after the tokens of ``parent`` (None: first block).

    Compared by identity: an entry is made once, when its block is published, so a block that
    is evicted and published again gets a new entry, and its old children no longer match it.
    """

    token_ids: tuple[int, ...]
    parent: CachedEntry | None


class CachedBlocks:
    """The cached blocks of one pool, and how many it evicted.

    - ``blocks``: ``block_hash -> the block a lookup hands out`` (vLLM's ``cached_block_hash_to_block``);
    - ``entries``: ``block_id -> what that cached block holds``;
    - ``copies``: ``block_hash -> further blocks holding the same content``, in the order they
      were published (two requests computed the same block): the first takes the place of an
      evicted one;
    - ``num_evictions``: cached blocks the pool handed out again for other content.
    """

    def __init__(self) -> None:
        self.blocks: dict[int, KVCacheBlock] = {}
        self.entries: dict[int, CachedEntry] = {}
        self.copies: dict[int, list[KVCacheBlock]] = {}
        self.num_evictions = 0

    def add(self, block: KVCacheBlock, block_hash: int, entry: CachedEntry) -> None:
        """``block`` now holds ``entry`` under ``block_hash`` (its hash is set); a hash already
        cached keeps its block, and ``block`` waits as a further copy."""
        block.block_hash = block_hash
        self.entries[block.block_id] = entry
        if block_hash in self.blocks:
            self.copies.setdefault(block_hash, []).append(block)
        else:
            self.blocks[block_hash] = block

    def evict(self, block: KVCacheBlock) -> None:
        """``block`` no longer holds its cached content (its hash is cleared); a further copy, if
        any, takes its place. A block without a hash only loses its entry, and counts no eviction."""
        self.entries.pop(block.block_id, None)
        block_hash = block.block_hash
        if block_hash is None:
            return
        copies = self.copies.pop(block_hash, [])
        if self.blocks.get(block_hash) is block:
            if copies:
                self.blocks[block_hash] = copies.pop(0)
            else:
                del self.blocks[block_hash]
        elif block in copies:
            copies.remove(block)
        if copies:
            self.copies[block_hash] = copies
        block.block_hash = None
        self.num_evictions += 1

    def clear(self) -> None:
        """Forget every cached block (their hashes are cleared); ``num_evictions`` stays."""
        for block in [*self.blocks.values(), *(b for copies in self.copies.values() for b in copies)]:
            block.block_hash = None
        self.blocks.clear()
        self.entries.clear()
        self.copies.clear()
