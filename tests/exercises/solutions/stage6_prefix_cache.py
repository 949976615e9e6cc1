"""Reference solutions for stage 6 (notebook 06_prefix_caching)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from minipaged.kv.prefix_cache import ROOT_HASH, hash_block


def chain_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """``hash_block(parent, block tokens)`` for every full block, each parent the previous hash."""
    hashes, parent = [], ROOT_HASH
    for i in range(len(token_ids) // block_size):
        parent = hash_block(parent, list(token_ids[i * block_size : (i + 1) * block_size]))
        hashes.append(parent)
    return hashes


def reusable_prefix_tokens(token_ids: Sequence[int], block_size: int, cached: dict[int, tuple[int, ...]]) -> int:
    """Leading full blocks found in ``cached`` and confirmed by their tokens, never the last token's block."""
    usable = (len(token_ids) - 1) // block_size  # full blocks that end before the last token
    hashes = chain_block_hashes(token_ids[: usable * block_size], block_size)
    hits = 0
    for i, h in enumerate(hashes):
        if cached.get(h) != tuple(token_ids[i * block_size : (i + 1) * block_size]):
            break
        hits += 1
    return hits * block_size


def evict_order(free_queue: list[int], finished: list[list[int]]) -> list[int]:
    """The free queue, then each finished table reversed (tail first)."""
    order = list(free_queue)
    for table in finished:
        order += reversed(table)
    return order


def copy_on_write(tables: list[list[int]], ref_cnt: dict[int, int], free_queue: list[int], idx: int) -> list[list[int]]:
    """Writers of a shared block copy it to the next free block; the last user writes in place."""
    tables = [list(t) for t in tables]
    ref, free = dict(ref_cnt), deque(free_queue)
    for table in tables:
        block = table[idx]
        if ref.get(block, 0) > 1:
            new = free.popleft()
            ref[block] -= 1
            ref[new] = 1
            table[idx] = new
    return tables
