"""Stage 6 (notebook 06): prefix caching — chained block hashes, hits, LRU eviction, copy-on-write, forks.

A full block is named by the hash of (its parent's hash, its token ids): equal hashes mean the
same tokens after the same prefix, so a new prompt can reuse the K/V. vLLM's names:
``block_hash`` on a ``KVCacheBlock``, ``cached_block_hash_to_block``, ``get_computed_blocks``.
``pool`` is a block pool as in stage 1 (``allocate``, ``free``, ``share``, ``touch``, ``blocks``,
``on_evict``). Check: the last cell of notebook 06, or ``python -m exercises my_engine 6``.
"""

from __future__ import annotations

from typing import Any

from minipaged.kv.prefix_cache import ROOT_HASH, hash_block  # noqa: F401  (you will need both)


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """**core** — the chained hash of every FULL block of ``token_ids``, in order.

    Block ``i`` is ``hash_block(hash of block i - 1, its token ids)``; block 0's parent is
    ``ROOT_HASH``; a last, partly filled block gets none. Equals ``minipaged.kv.prefix_cache.chain_hashes``."""
    raise NotImplementedError("block_hashes: hash_block(parent, block tokens) for each full block")


class PrefixCache:
    def __init__(self, pool: Any, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.cached_block_hash_to_block: dict[int, Any] = {}
        pool.on_evict = self.evict

    def get_computed_blocks(self, token_ids: list[int]) -> list[Any]:
        """**core** — the cached blocks a new prompt can reuse, in order.

        Walk the prompt's block hashes; a block is a hit if its hash is in ``cached_block_hash_to_block``;
        stop at the first miss. Never reuse the block of the prompt's LAST token (its logits are
        needed to sample): hash only ``token_ids[:-1]``'s full blocks. (vLLM's does the same; like
        it, this trusts the 64-bit hash.)"""
        raise NotImplementedError("PrefixCache.get_computed_blocks: hits along the chain, up to the last token's block")

    def cache_full_blocks(self, token_ids: list[int], blocks: list[Any]) -> None:
        """**core** — publish a sequence's full blocks: set each one's ``block_hash`` and register it.

        ``blocks`` are the sequence's blocks in logical order, ``token_ids`` its tokens. A block
        already cached (it has a ``block_hash``), or a hash already cached by another block, is left as is."""
        raise NotImplementedError(
            "PrefixCache.cache_full_blocks: block.block_hash = h and cached_block_hash_to_block[h] = block"
        )

    def evict(self, block: Any) -> None:
        """**stretch** — LRU eviction: the pool hands out ``block`` while it still holds a cached prefix.

        The pool calls it (``pool.on_evict``, set in ``__init__``) for the block at the front of the
        free queue, the least recently freed; drop it from ``cached_block_hash_to_block``.
        Until then a freed block keeps its hash: a later prompt can still hit it."""
        raise NotImplementedError("PrefixCache.evict: forget the block's hash")


def fork(pool: Any, block_ids: list[int]) -> list[int]:
    """**stretch** — parallel sampling: a child's table sharing every block of its parent (``ref_cnt + 1`` each).

    Returns a NEW list equal to ``block_ids``; nothing is allocated."""
    raise NotImplementedError("fork: pool.share each block, return a copy of the list")


def copy_on_write(pool: Any, block_ids: list[int], idx: int) -> tuple[int, int] | None:
    """**stretch** — make logical block ``idx`` of a table writable before a step writes into it.

    A shared block (``ref_cnt > 1``): take a new block from the pool, drop one reference to the
    shared one, put the new id in ``block_ids[idx]`` and return ``(old id, new id)`` (the copy the
    step owes). The block's last user writes in place: return ``None``."""
    raise NotImplementedError(
        "copy_on_write: a shared block is replaced by a new one (the copy), the last user writes in place"
    )
