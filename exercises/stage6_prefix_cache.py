"""Stage 6 exercises (notebook 06_prefix_caching). Check: ``python -m exercises stage6``.

Write them without looking at ``minipaged/kv/prefix_cache.py`` (use its ``hash_block`` and
``ROOT_HASH``, imported below). Replace each ``raise NotImplementedError`` with your code; keep
the names and signatures. The checks compare your answers with the package's ``chain_hashes``
and ``BlockPool``, and with what a prefix cache must reuse.
"""

from __future__ import annotations

from collections.abc import Sequence

from minipaged.kv.prefix_cache import ROOT_HASH, hash_block  # noqa: F401  (you will need both)


def chain_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The chained hash of every **full** block of ``token_ids``, in order.

    Block ``i`` (tokens ``i * block_size .. (i + 1) * block_size - 1``) is named by
    ``hash_block(hash of block i - 1, its token ids)``; block 0's parent is ``ROOT_HASH``. A last,
    partly filled block gets no hash. Must equal ``minipaged.kv.prefix_cache.chain_hashes``.
    """
    raise NotImplementedError


def reusable_prefix_tokens(token_ids: Sequence[int], block_size: int, cached: dict[int, tuple[int, ...]]) -> int:
    """How many leading tokens of a new prompt can come from the prefix cache.

    cached: the cache, as a dict ``block hash -> the token ids that block holds`` (a tuple).
    Walk the prompt's full blocks in order: a block is reused if its chained hash is in ``cached``
    **and** the stored tokens equal its own (a hash collision must cost a miss, never wrong K/V);
    stop at the first block that is not. Never reuse the block that holds the prompt's last token
    (its logits are needed to sample, and a shared block is never written again): a 48-token
    prompt seen before, with blocks of 16, reuses 32 tokens. Returns a multiple of ``block_size``.

    This is the engine's prefix match (``minipaged/engine/kv_manager.py``), which also checks that
    each hit follows the block hit before it (see ``minipaged/kv/prefix_cache.py``).
    """
    raise NotImplementedError


def evict_order(free_queue: list[int], finished: list[list[int]]) -> list[int]:
    """LRU: the order in which free blocks will be handed out once the tables in ``finished`` are freed.

    free_queue: the free block ids now, the next one to be handed out first; finished: block
    tables (logical order) freed one after the other; each of their blocks has ``ref_cnt`` 1, so
    freeing makes it free. A freed table goes to the back of the queue **tail first** (vLLM's
    order, and ``BlockPool.free``'s): its last block is reused before its first, so the shared
    beginning of a prompt stays cached longest.

    Example: ``evict_order([5], [[0, 1, 2], [3, 4]])`` is ``[5, 2, 1, 0, 4, 3]``.
    """
    raise NotImplementedError


def copy_on_write(tables: list[list[int]], ref_cnt: dict[int, int], free_queue: list[int], idx: int) -> list[list[int]]:
    """Every table in turn writes into its logical block ``idx``; return the tables afterwards.

    A table whose block at ``idx`` is shared (``ref_cnt > 1``) first takes the next free block
    (the front of ``free_queue``) as its own copy and drops one reference to the shared block;
    a table that is the block's last user (``ref_cnt`` 1) writes in place. ``ref_cnt`` maps block
    id -> users (blocks not in it are free). Do not change the arguments: work on copies.

    Example (notebook 06, ``SamplingParams(n=3)``): tables ``[[7, 3], [7, 3], [7, 3]]``, ``ref_cnt
    {7: 3, 3: 3}``, ``free_queue [9, 0]``, ``idx 1`` -> ``[[7, 9], [7, 0], [7, 3]]``.
    """
    raise NotImplementedError
