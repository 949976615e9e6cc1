"""Stage 6: prefix caching — reuse the K/V of full blocks that another request already computed.

A full block is named by a hash that chains its parent block's hash with its own token ids
(and an optional extra key, e.g. a LoRA or image id), so equal hashes mean equal prefixes up
to and including that block. Hashes are blake2b digests, stable across processes.

The map ``block_hash -> block`` lives in the block pool, as vLLM's ``BlockPool`` owns
``cached_block_hash_to_block`` (:class:`~minipaged.kv.cached_blocks.CachedBlocks`); this module
keeps the rules over it: what may be published, and what a lookup hits. A freed block whose
``ref_cnt`` drops to 0 keeps its hash and waits in the pool's LRU free queue: a later request can
revive it (a hit) until allocation takes it for new tokens, and the pool evicts it from its map
in the same call (nothing points up from the pool).

A hash collision costs a miss, never wrong K/V: each cached block also keeps its own token ids
and a link to the entry of the block before it in the sequence that computed it. A hit must
match both: the tokens, and the parent being the block matched just before. Block ``i``'s K/V
depend on every token up to it, and by induction the chain of hits holds exactly the looked-up
sequence's tokens.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from minipaged.kv.block_pool import KVBlockPool
from minipaged.kv.cached_blocks import CachedEntry
from minipaged.kv.kv_cache_block import KVCacheBlock

ROOT_HASH = 0  # the parent of a sequence's first block


def hash_block(parent_hash: int, token_ids: Sequence[int], extra_key: object = None) -> int:
    """A 64-bit hash of (parent hash, this block's token ids, extra key), the same in every process."""
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<Q", parent_hash))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if extra_key is not None:
        h.update(repr(extra_key).encode())
    return int.from_bytes(h.digest(), "little")


def chain_hashes(
    token_ids: Sequence[int], block_size: int, known: list[int] | None = None, extra_key: object = None
) -> list[int]:
    """Hashes of every full block of ``token_ids``; ``known`` (a prefix of them) is extended, not redone."""
    hashes = list(known or [])
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else ROOT_HASH
        hashes.append(hash_block(parent, token_ids[i * block_size : (i + 1) * block_size], extra_key))
    return hashes


@dataclass(eq=False)
class PrefixIndex:
    """What a prefix lookup reads: ``blocks`` (``block_hash -> block``) and ``entries``
    (``block_id -> what the block holds``). A :class:`PrefixCache` is one; during an engine step
    a lookup reads the cache together with the blocks the step is filling
    (:meth:`~minipaged.engine.step_transaction.StepTransaction.prefix_index`)."""

    blocks: Mapping[int, KVCacheBlock]
    entries: Mapping[int, CachedEntry]

    def find(self, hashes: Sequence[int], token_ids: Sequence[int], block_size: int) -> list[KVCacheBlock]:
        """The cached blocks for the longest run of leading ``hashes`` (no reference taken).

        token_ids: the sequence's tokens; a hit must hold the same tokens and follow the block hit
        just before it (see the module docstring). The engine's ``EnginePlugins.prefix_lookup``.
        """
        hits: list[KVCacheBlock] = []
        parent = None
        for i, h in enumerate(hashes):
            block = self.blocks.get(h)
            entry = self.entries.get(block.block_id) if block is not None else None
            tokens = tuple(token_ids[i * block_size : (i + 1) * block_size])
            if block is None or entry is None or entry.token_ids != tokens or entry.parent is not parent:
                break
            hits.append(block)
            parent = entry
        return hits

    def entry_for(self, block_hash: int, token_ids: Sequence[int], parent: KVCacheBlock | None) -> CachedEntry | None:
        """What a block that just filled with ``token_ids`` after block ``parent`` (None: a first
        block) holds, in the cache's terms; the one publishing rule, used by :meth:`PrefixCache.insert`
        and by an engine step's staging alike.

        - the hash is new: a new entry;
        - the hash is cached with the same tokens after the same parent: the cached entry itself.
          The block is a second copy of content already cached (two requests computed it), and
          the blocks after it chain on from the cached copy, so a lookup reaches them;
        - None, the block cannot be published: its parent holds no cached content (no lookup
          could get there), or the hash names other content (a collision).
        """
        parent_entry = None
        if parent is not None:
            parent_entry = self.entries.get(parent.block_id)
            if parent_entry is None:
                return None
        tokens = tuple(token_ids)
        cached = self.blocks.get(block_hash)
        if cached is None:
            return CachedEntry(tokens, parent_entry)
        entry = self.entries.get(cached.block_id)
        if entry is not None and entry.token_ids == tokens and entry.parent is parent_entry:
            return entry
        return None

    def cached_tokens(self) -> dict[int, tuple[int, ...]]:
        """The cache as ``block_hash -> the token ids that block holds`` (stage 6's ``cached``)."""
        return {h: self.entries[b.block_id].token_ids for h, b in self.blocks.items() if b.block_id in self.entries}


class PrefixCache(PrefixIndex):
    """The prefix cache's rules over a :class:`BlockPool`'s map of cached blocks (``pool.cached_blocks``).

    The pool owns the map and eviction: when it hands a cached free block out again it evicts
    the block from the map in the same call, so the map never holds a block the pool gave away,
    and the pool never calls up into the cache. The cache publishes into the map
    (:meth:`insert`) and reads it (:meth:`find`, :meth:`lookup`): ``blocks``, ``entries``,
    ``copies`` and ``num_evictions`` are the map's.
    """

    def __init__(self, pool: KVBlockPool) -> None:
        self.pool = pool

    @property
    def blocks(self) -> dict[int, KVCacheBlock]:  # type: ignore[override]  # read-only: the map is the pool's
        return self.pool.cached_blocks.blocks

    @property
    def entries(self) -> dict[int, CachedEntry]:  # type: ignore[override]  # read-only: the map is the pool's
        return self.pool.cached_blocks.entries

    @property
    def copies(self) -> dict[int, list[KVCacheBlock]]:
        return self.pool.cached_blocks.copies

    @property
    def num_evictions(self) -> int:
        """Cached blocks the pool handed out again for other content."""
        return self.pool.cached_blocks.num_evictions

    def evict(self, block: KVCacheBlock) -> None:
        """Forget ``block``'s cached content now, as the pool does when it hands the block out again."""
        self.pool.cached_blocks.evict(block)

    def lookup(self, hashes: Sequence[int], token_ids: Sequence[int], block_size: int) -> list[KVCacheBlock]:
        """:meth:`find`, each hit taken (``ref_cnt + 1``, revived if it was free)."""
        hits = self.find(hashes, token_ids, block_size)
        self.take(hits)
        return hits

    def take(self, hits: Sequence[KVCacheBlock]) -> None:
        """One more reference to each hit (a free one leaves the free queue)."""
        for block in hits:
            self.pool.touch(block)

    def insert(
        self, block: KVCacheBlock, block_hash: int, token_ids: Sequence[int], parent: KVCacheBlock | None = None
    ) -> bool:
        """Publish a block that just became full; ``parent`` is the block before it in the same
        sequence (None for a first block). Returns whether it now holds cached content.

        The rule is :meth:`entry_for`'s. A second copy of content already cached is cached too (as
        vLLM keeps every block of a hash): lookups hand out the first copy, and the second takes
        its place if the first is evicted. What matters more: the blocks after a second copy
        chain on, so a request that computed a cached block again still publishes the rest.
        """
        if block.block_hash is not None:
            return False
        entry = self.entry_for(block_hash, token_ids, parent)
        if entry is None:
            return False
        self.pool.cached_blocks.add(block, block_hash, entry)
        return True

    def reset(self) -> bool:
        """Forget every cached prefix, as vLLM's ``reset_prefix_cache``: only while no block is in
        use (returns False and changes nothing otherwise), so no running request loses a block
        it reads. Returns True once the cache is empty."""
        if self.pool.num_used_blocks:
            return False
        self.pool.cached_blocks.clear()
        return True

    def __len__(self) -> int:
        return len(self.blocks)


def copy_on_write(pool: KVBlockPool, block_ids: list[int], idx: int) -> tuple[int, int] | None:
    """Make logical block ``idx`` of a table writable before a step writes into it.

    A block others share (``ref_cnt > 1``) is replaced in ``block_ids`` by a new block from the
    pool, and one reference to it is dropped; returns ``(src, dst)``, the copy owed before the
    forward. The block's last user writes in place: None. The engine's ``EnginePlugins.copy_on_write``.
    """
    old = block_ids[idx]
    if pool.blocks[old].ref_cnt <= 1:
        return None
    new = pool.allocate(1)[0].block_id
    pool.free([old])
    block_ids[idx] = new
    return old, new
