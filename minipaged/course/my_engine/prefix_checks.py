"""The checks of stage 6: chained block hashes, hits, LRU eviction, forks and copy-on-write."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

from minipaged.course.my_engine.base import CheckFailed

# ---------------------------------------------------------------- stage 6: the prefix cache


def _stage6_hashes(m: ModuleType) -> None:
    from minipaged.kv.prefix_cache import chain_hashes

    for seed in range(6):
        rng = random.Random(seed)
        block_size = rng.choice([1, 4, 16])
        tokens = [rng.randrange(50) for _ in range(rng.randint(0, 70))]
        want, got = chain_hashes(tokens, block_size), m.block_hashes(tokens, block_size)
        if got != want:
            hint = ""
            if len(got) != len(want):
                hint = "only FULL blocks get a hash: len(token_ids) // block_size of them"
            elif got[:1] == want[:1]:
                hint = "each block's parent is the hash of the block before it (block 0's is ROOT_HASH)"
            case = f"block_hashes({len(tokens)} tokens, block_size {block_size})"
            raise CheckFailed(case, want[:3], got[:3], hint or "hash_block(parent hash, this block's token ids)")


def _hooked_pool(num_blocks: int) -> Any:
    """The package's pool with the seam my_engine's stage 1 pool has: ``pool.on_evict(block)`` is
    called, the block's ``block_hash`` still set, for each cached block that allocation reuses (the
    package's own pool evicts these from its own map, ``cached_blocks``, instead)."""
    from minipaged.kv.block_pool import BlockPool

    class HookedPool(BlockPool):
        on_evict: Any = None

        def _maybe_evict_cached_block(self, block: Any) -> None:
            if self.on_evict is not None and block.block_hash is not None:
                self.on_evict(block)  # before the pool clears the hash, as the learner's evict(block) sees it
            super()._maybe_evict_cached_block(block)

    return HookedPool(num_blocks)


def _prefix_setup(m: ModuleType) -> tuple[Any, Any, list[int], list[Any]]:
    pool = _hooked_pool(8)
    cache = m.PrefixCache(pool, 4)
    a = list(range(100, 114))  # 14 tokens: 3 full blocks and 2 more
    blocks = pool.allocate(4)
    cache.cache_full_blocks(a, blocks)
    return pool, cache, a, blocks


def _stage6_hits(m: ModuleType) -> None:
    pool, cache, a, blocks = _prefix_setup(m)
    ids = [b.block_id for b in blocks]
    if [b.block_hash is not None for b in blocks] != [True, True, True, False]:
        raise CheckFailed(
            "cache_full_blocks(A's 14 tokens, its 4 blocks of 4): which blocks get a block_hash",
            [True, True, True, False],
            [b.block_hash is not None for b in blocks],
            "only full blocks are cached: the 4th holds 2 tokens",
        )
    cases = [
        ("B = A's first 9 tokens + 7 others", a[:9] + [1] * 7, ids[:2], ""),
        (
            "A's first 12 tokens exactly",
            a[:12],
            ids[:2],
            "a hit stops before the block of the prompt's last token: its logits are needed, so it is computed again",
        ),
        (
            "C: A's tokens with token 5 changed",
            a[:5] + [0] + a[6:],
            ids[:1],
            "the hits stop at the first block that is not cached: the chain continues only through hits",
        ),
        ("D: nothing in common", [9] * 20, [], ""),
    ]
    for what, tokens, want, hint in cases:
        got = [b.block_id for b in cache.get_computed_blocks(tokens)]
        if got != want:
            raise CheckFailed(
                f"A cached (blocks {ids}, 4 tokens a block); get_computed_blocks({what})",
                want,
                got,
                hint or "walk block_hashes(prompt) in order; stop at the first miss",
            )


def _stage6_lru(m: ModuleType) -> None:
    pool, cache, a, blocks = _prefix_setup(m)
    pool.free(blocks)  # A finished: its blocks go back tail first, their hashes kept
    taken = pool.allocate(5)  # 4 never-used blocks first, then A's 4th (no hash), then ...
    want_taken = [4, 5, 6, 7, 3]
    if [b.block_id for b in taken] != want_taken:
        raise CheckFailed(
            "8 blocks, A held 0-3 and finished; allocate(5)",
            want_taken,
            [b.block_id for b in taken],
            "stage 1's free queue: never-used blocks first, then A's blocks tail first",
        )
    got = [b.block_id for b in cache.get_computed_blocks(a)]
    if got != [0, 1, 2]:
        raise CheckFailed(
            "after that, get_computed_blocks(A's 14 tokens): A's cached blocks are still free, not reused",
            [0, 1, 2],
            got,
            "a freed block keeps its block_hash until the pool hands it out again",
        )
    pool.allocate(1)  # block 2: A's third block is evicted
    got = [b.block_id for b in cache.get_computed_blocks(a)]
    if got != [0, 1]:
        raise CheckFailed(
            "then allocate(1) reuses block 2 (A's 3rd block): get_computed_blocks(A's 14 tokens)",
            [0, 1],
            got,
            "evict(block) must drop a reused block from cached_block_hash_to_block (the pool calls on_evict)",
        )


def _stage6_cow(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool, fork_blocks
    from minipaged.kv.prefix_cache import copy_on_write

    pools = {"mine": BlockPool(10), "ref": BlockPool(10)}
    tables: dict[str, list[list[int]]] = {}
    for key, pool in pools.items():
        parent = [b.block_id for b in pool.allocate(2)]
        fork = m.fork if key == "mine" else fork_blocks
        tables[key] = [parent, fork(pool, parent), fork(pool, parent)]
    if [[b.ref_cnt for b in p.blocks[:2]] for p in pools.values()] != [[3, 3], [3, 3]]:
        raise CheckFailed(
            "a parent of 2 blocks forked twice: ref_cnt of its blocks",
            [3, 3],
            [b.ref_cnt for b in pools["mine"].blocks[:2]],
            "a fork shares every block: ref_cnt + 1 each",
        )
    if tables["mine"][1] is tables["mine"][0]:
        raise CheckFailed(
            "fork returns the child's table",
            "a new list",
            "the parent's own list",
            "return a copy: the child's table changes on its own later (copy-on-write)",
        )
    for i in range(3):
        want = copy_on_write(pools["ref"], tables["ref"][i], 1)
        got = m.copy_on_write(pools["mine"], tables["mine"][i], 1)
        if got != want or tables["mine"] != tables["ref"]:
            hint = "a shared block (ref_cnt > 1) is copied into a new block; the last user writes in place (None)"
            raise CheckFailed(
                f"3 tables share [0, 1]; table {i} writes into its block 1: (copy, tables)",
                (want, tables["ref"]),
                (got, tables["mine"]),
                hint,
            )
    if [b.ref_cnt for b in pools["mine"].blocks] != [b.ref_cnt for b in pools["ref"].blocks]:
        raise CheckFailed(
            "after the three writes: ref_cnt of every block",
            [b.ref_cnt for b in pools["ref"].blocks],
            [b.ref_cnt for b in pools["mine"].blocks],
            "drop one reference to the shared block you copied",
        )
