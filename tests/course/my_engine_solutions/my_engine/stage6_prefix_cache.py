"""Stage 6 (notebook 06): prefix caching — chained block hashes, hits, LRU eviction, copy-on-write, forks."""

from __future__ import annotations

from typing import Any

from minipaged.kv.prefix_cache import ROOT_HASH, hash_block


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    hashes: list[int] = []
    for i in range(len(token_ids) // block_size):
        hashes.append(hash_block(hashes[-1] if hashes else ROOT_HASH, token_ids[i * block_size : (i + 1) * block_size]))
    return hashes


class PrefixCache:
    def __init__(self, pool: Any, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.cached_block_hash_to_block: dict[int, Any] = {}
        pool.on_evict = self.evict

    def get_computed_blocks(self, token_ids: list[int]) -> list[Any]:
        hits = []
        for h in block_hashes(token_ids[: len(token_ids) - 1], self.block_size):
            block = self.cached_block_hash_to_block.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def cache_full_blocks(self, token_ids: list[int], blocks: list[Any]) -> None:
        for h, block in zip(block_hashes(token_ids, self.block_size), blocks):
            if h not in self.cached_block_hash_to_block and block.block_hash is None:
                block.block_hash = h
                self.cached_block_hash_to_block[h] = block

    def evict(self, block: Any) -> None:
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]


def fork(pool: Any, block_ids: list[int]) -> list[int]:
    for block_id in block_ids:
        pool.share(pool.blocks[block_id])
    return list(block_ids)


def copy_on_write(pool: Any, block_ids: list[int], idx: int) -> tuple[int, int] | None:
    block = pool.blocks[block_ids[idx]]
    if block.ref_cnt <= 1:
        return None
    new = pool.allocate(1)[0]
    pool.free([block])
    block_ids[idx] = new.block_id
    return block.block_id, new.block_id
