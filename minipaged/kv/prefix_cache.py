"""Stage 6: prefix caching — reuse the K/V of full blocks that another request already computed.

A full block is named by a hash that chains its parent block's hash with its own token ids
(and an optional extra key, e.g. a LoRA or image id), so equal hashes mean equal prefixes up
to and including that block. Hashes are blake2b digests, stable across processes.

A freed block whose ``ref_cnt`` drops to 0 keeps its hash and waits in the pool's LRU free
queue: a later request can revive it (a hit) until allocation takes it for new tokens and drops
the hash (an eviction). The tokens are stored too and compared on every hit, so even a hash
collision can never share the wrong K/V.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from minipaged.kv.allocator import BlockPool, KVCacheBlock

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


class PrefixCache:
    """The map ``block_hash -> block`` over a :class:`BlockPool`, with hit counters."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        pool.on_evict = self._forget
        self.blocks: dict[int, KVCacheBlock] = {}
        self.tokens: dict[int, tuple[int, ...]] = {}  # block_id -> the token ids it holds
        self.num_evictions = 0

    def _forget(self, block: KVCacheBlock) -> None:
        """Called by the pool when allocation reuses a cached free block."""
        if self.blocks.get(block.block_hash) is block:
            del self.blocks[block.block_hash]
        self.tokens.pop(block.block_id, None)
        self.num_evictions += 1

    def lookup(self, hashes: Sequence[int], token_ids: Sequence[int], block_size: int) -> list[KVCacheBlock]:
        """The cached blocks for the longest run of leading ``hashes``, each taken (``ref_cnt + 1``).

        token_ids: the sequence's tokens, to confirm each hit.
        """
        hits: list[KVCacheBlock] = []
        for i, h in enumerate(hashes):
            block = self.blocks.get(h)
            if block is None or self.tokens[block.block_id] != tuple(token_ids[i * block_size : (i + 1) * block_size]):
                break
            hits.append(block)
        for block in hits:
            self.pool.touch(block)
        return hits

    def insert(self, block: KVCacheBlock, block_hash: int, token_ids: Sequence[int]) -> None:
        """Publish a block that just became full. A block whose hash is already cached by another
        block (computed twice) stays private: one copy is enough."""
        if block.block_hash is not None or block_hash in self.blocks:
            return
        block.block_hash = block_hash
        self.blocks[block_hash] = block
        self.tokens[block.block_id] = tuple(token_ids)

    def __len__(self) -> int:
        return len(self.blocks)
