"""Conformance with vLLM V1's tests/v1/core/test_prefix_caching.py (and the prefix-cache test of
test_scheduler_e2e.py): hits, sharing, the free queue's order, eviction and reset.

vLLM tests its KVCacheManager directly; minipaged's counterpart lives inside the engine, so the
manager-level cases run through ``LLM`` (one ``run_step`` at a time, the embedded model, greedy,
token-id prompts) and the pool-level cases through ``BlockPool`` and ``PrefixCache``. Each test
names the vLLM test it follows. Where minipaged differs on purpose the test asserts minipaged's
rule and says why:

- block ids are one lower: vLLM's block 0 is a null block kept out of the free queue, minipaged's
  block 0 is an ordinary block (docs/vllm_v1.md, "Padding block");
- freed blocks go to the back of the free queue, a request's tail first (docs/stage6.md, rule 4).
  That was vLLM's order before 2026; vLLM now puts freed blocks that have no hash at the front,
  so its partial blocks are reused first and its block ids below differ from these;
- a hit is confirmed by the block's tokens and its parent, not by the hash alone (64-bit hashes;
  docs/vllm_v1.md, "Hits");
- ``extra_key`` (minipaged's only extra hash input) is mixed into every block's hash.

Left out (no such thing in minipaged), by what they test:

- KV cache groups, hybrid models, sliding windows, Mamba: test_prefill_hybrid_model*,
  test_different_block_size, test_cache_blocks_multi_group, test_hybrid_*, test_pure_swa_*,
  test_swa_*, test_mamba_*, test_can_fit_full_sequence_swa_cap_admits_long_prompt;
- EAGLE / MTP hashing: test_eagle_* (their "a whole-prompt hit recomputes the last block" premise
  is used below);
- prompt logprobs: test_prefill_plp (its "duplicate blocks share a hash" fact is used below);
- multimodal extra keys: test_mm_prefix_caching;
- KV events: test_kv_cache_events*, test_block_stored_event_*, test_block_removed_event_group_idx,
  test_emit_cached_block_events*, test_null_parent_block_hash, test_masked_block_*;
- stats objects: test_prefix_cache_stats_disabled; KV connectors: test_cache_hit_local_and_external*.
"""

from __future__ import annotations

from conformance_kit import BS, COMMON, engine, free_order, greedy, pool_of, step

from minipaged import LLM
from minipaged.kv.block_pool import BlockPool
from minipaged.kv.prefix_cache import PrefixCache, chain_hashes, hash_block

# ---- the manager's cases, on the engine ------------------------------------------------------


def test_prefill_hits_shares_and_evicts_in_free_queue_order():
    """test_prefix_caching.py::test_prefill (vLLM's block ids minus one). Only full blocks are
    hashed, with chained hashes; a second request shares them while the first still runs; freeing
    queues blocks tail first; a cache miss then evicts in free-queue order. Differs (rule 4): the
    partial blocks 3 and 4 wait behind the never-used blocks, so the next request gets block 5,
    where vLLM now reuses a partial block first."""
    llm = engine(10)
    pool = pool_of(llm)
    prompt0 = COMMON + [3] * 7
    r0 = llm.add_request(prompt0, greedy(8))
    assert step(llm).tables == {r0: [0, 1, 2, 3]}
    hashes = chain_hashes(prompt0, BS)
    assert len(hashes) == 3
    assert [pool.blocks[i].block_hash for i in range(4)] == [*hashes, None]
    assert [pool.blocks[i].ref_cnt for i in range(4)] == [1, 1, 1, 1]

    r1 = llm.add_request(COMMON + [3] * 5, greedy(8))  # while r0 still holds the blocks
    s = step(llm)
    assert s.scheduled == {r0: 1, r1: 5} and s.tables[r1] == [0, 1, 2, 4]
    assert llm.get_output(r1).num_cached_tokens == 3 * BS
    assert [pool.blocks[i].ref_cnt for i in range(3)] == [2, 2, 2]
    assert pool.num_free_blocks == 5

    llm.abort_request([r0, r1])
    assert pool.num_free_blocks == 10
    assert free_order(llm) == [5, 6, 7, 8, 9, 3, 4, 2, 1, 0]  # vLLM now: [5, 4, 6, ..., 10, 3, 2, 1]

    r2 = llm.add_request(COMMON + [3] * 6, greedy(8))  # a hit on blocks that are all free
    assert step(llm).tables[r2] == [0, 1, 2, 5]
    assert llm.get_output(r2).num_cached_tokens == 3 * BS
    assert pool.num_free_blocks == 6 and len(free_order(llm)) == 6
    assert all(b.ref_cnt == 0 for b in pool.free_queue)
    llm.abort_request(r2)

    r3 = llm.add_request([99] * (10 * BS - 1), greedy(2))  # a miss as large as the pool
    assert step(llm).tables[r3] == [6, 7, 8, 9, 3, 4, 5, 2, 1, 0]  # the eviction order
    assert llm.kv_stats()["prefix_evictions"] == 3  # the common blocks, evicted last
    q = pool.free_queue
    assert len(q) == 0 and q.head.next_free_block is q.tail and q.tail.prev_free_block is q.head


def test_decode_hashes_a_block_once_it_fills():
    """test_prefix_caching.py::test_decode: decode tokens that stay in the last block allocate
    nothing and leave it unhashed; once they fill it, it is hashed (over prompt and output tokens)
    and a new, unhashed block follows."""
    llm = engine(10)
    pool = pool_of(llm)
    prompt = COMMON + [3] * 7
    r0 = llm.add_request(prompt, greedy(40))
    assert step(llm).tables[r0] == [0, 1, 2, 3]  # 55 tokens computed
    for _ in range(4):
        s = step(llm)  # 59
    assert s.tables[r0] == [0, 1, 2, 3] and pool.blocks[3].block_hash is None
    for _ in range(19):
        s = step(llm)  # 78: block 3 (tokens 48..63) is full
    assert s.tables[r0] == [0, 1, 2, 3, 4]
    tokens = prompt + llm.get_output(r0).outputs[0].token_ids
    assert len(tokens) == 79
    assert pool.blocks[3].block_hash == chain_hashes(tokens, BS)[3]
    assert pool.blocks[4].block_hash is None


def test_evict_reuses_free_blocks_in_lru_order():
    """test_prefix_caching.py::test_evict. Freed requests queue their blocks tail first; a request
    hitting the first two blocks of a freed prompt revives them from the middle of the queue and
    takes its new block from the front. Differs (rule 4): the partial block 5 is queued behind the
    never-used block 9, so the new block is 9 (vLLM: its partial block, at the front)."""
    llm = engine(10)
    pool = pool_of(llm)
    r0 = llm.add_request(list(range(5 * BS + 7)), greedy(4))
    r1 = llm.add_request(list(range(5 * BS + 7, 8 * BS + 7)), greedy(4))
    assert step(llm).tables == {r0: [0, 1, 2, 3, 4, 5], r1: [6, 7, 8]}
    assert pool.num_free_blocks == 1
    llm.abort_request(r0)
    assert free_order(llm) == [9, 5, 4, 3, 2, 1, 0]  # vLLM now: [6, 10, 5, 4, 3, 2, 1]
    llm.abort_request(r1)
    assert free_order(llm) == [9, 5, 4, 3, 2, 1, 0, 8, 7, 6]

    r2 = llm.add_request(list(range(2 * BS + 3)), greedy(2))
    assert step(llm).tables[r2] == [0, 1, 9]
    assert llm.get_output(r2).num_cached_tokens == 2 * BS
    assert pool.num_free_blocks == 7


def test_reused_block_loses_its_hash():
    """test_prefix_caching.py::test_hash_block_correct_reuse: a cached block reused for a partial
    block no longer carries the old hash."""
    llm = engine(1)
    pool = pool_of(llm)
    llm.generate([list(range(BS))], greedy(1), use_tqdm=False)
    assert pool.blocks[0].block_hash == chain_hashes(list(range(BS)), BS)[0]
    llm.generate([list(range(BS - 1))], greedy(1), use_tqdm=False)
    assert pool.blocks[0].block_hash is None
    stats = llm.kv_stats()
    assert stats["prefix_evictions"] == 1 and stats["cached_blocks"] == 0


def test_a_hit_block_is_not_the_one_evicted():
    """test_prefix_caching.py::test_computed_blocks_not_evicted: with two cached free blocks, a
    request hitting the first one evicts the second for its new block."""
    llm = engine(2)
    r0 = llm.add_request(list(range(BS)), greedy(1))
    r1 = llm.add_request(list(range(BS, 2 * BS)), greedy(1))
    assert step(llm).tables == {r0: [0], r1: [1]}  # both finish and free: the queue is [0, 1]
    r2 = llm.add_request(list(range(2 * BS)), greedy(1))
    assert step(llm).tables[r2] == [0, 1]
    assert llm.get_output(r2).num_cached_tokens == BS
    assert llm.kv_stats()["prefix_evictions"] == 1


def test_without_prefix_caching_nothing_is_shared_or_hashed():
    """test_prefix_caching.py::test_basic_prefix_caching_disabled (block size 4): no hit on a
    shared prefix, no block hashed, and a request that does not fit waits for free blocks."""
    llm = engine(4, caching=False, block_size=4)
    pool = pool_of(llm)
    r1 = llm.add_request(list(range(10)), greedy(1))
    assert step(llm).tables == {r1: [0, 1, 2]}
    r2 = llm.add_request(list(range(15)), greedy(2))  # a shared prefix of 10 tokens
    assert step(llm).tables == {r2: [3, 2, 1, 0]}
    assert llm.get_output(r2).num_cached_tokens == 0
    r3 = llm.add_request(list(range(4)), greedy(1))
    assert step(llm).scheduled == {r2: 1}  # no block for r3 until r2 finishes
    assert step(llm).scheduled == {r3: 4}
    assert all(b.block_hash is None for b in pool.blocks)
    stats = llm.kv_stats()
    assert stats["prefix_hit_tokens"] == 0 and stats["cached_blocks"] == 0


def _run_then_refuse_a_hit(llm: LLM) -> int:
    """Cache 6 blocks, hold 4 others, and queue a request that hits the 6 cached (free) blocks but
    needs 3 more: 9 > 6 free. Returns that request, still waiting after one step."""
    llm.generate([COMMON * 2], greedy(1), use_tqdm=False)  # blocks 0..5 cached, queued 6 7 8 9 5 .. 0
    holder = llm.add_request([200] * 62, greedy(2))
    assert step(llm).tables == {holder: [6, 7, 8, 9]}
    big = llm.add_request(COMMON * 3, greedy(1))
    assert step(llm).scheduled == {holder: 1}  # the holder finishes in this step
    return big


def test_refused_admission_leaves_hit_blocks_untouched():
    """test_prefix_caching.py::test_prefill_not_enough_free_blocks_with_computed_blocks: a request
    whose hit includes free cached blocks, but that cannot get its new blocks, is not admitted and
    takes nothing: the hit blocks stay free and cached. Once blocks are free it gets the full hit."""
    llm = engine(10)
    pool = pool_of(llm)
    big = _run_then_refuse_a_hit(llm)
    assert llm.kv_stats()["num_waiting"] == 1
    assert [pool.blocks[i].ref_cnt for i in range(6)] == [0] * 6
    assert [pool.blocks[i].block_hash for i in range(6)] == chain_hashes(COMMON * 2, BS)
    assert {0, 1, 2, 3, 4, 5} <= set(free_order(llm))
    assert llm.kv_stats()["cached_blocks"] == 6 + 3  # and the holder's 3 full blocks
    s = step(llm)
    assert s.scheduled == {big: 3 * BS} and s.tables[big] == [0, 1, 2, 3, 4, 5, 9, 8, 7]
    assert llm.get_output(big).num_cached_tokens == 6 * BS


def test_reset_prefix_cache_refuses_while_blocks_are_used():
    """test_prefix_caching.py::test_reset_prefix_cache: while requests hold blocks the reset fails
    and changes nothing; once all are free it forgets every hash and the next run hits nothing."""
    llm = engine(10)
    pool = pool_of(llm)
    r0 = llm.add_request(COMMON + [3] * 7, greedy(5))
    step(llm)
    r1 = llm.add_request(COMMON + [4] * 7, greedy(5))
    assert step(llm).tables[r1] == [0, 1, 2, 4]
    before = [(b.ref_cnt, b.block_hash) for b in pool.blocks]
    assert llm.reset_prefix_cache() is False
    assert [(b.ref_cnt, b.block_hash) for b in pool.blocks] == before
    assert llm.kv_stats()["cached_blocks"] == 3
    llm.abort_request([r0, r1])
    assert llm.reset_prefix_cache() is True
    assert llm.kv_stats()["cached_blocks"] == 0 and all(b.block_hash is None for b in pool.blocks)
    assert llm.generate([COMMON + [3] * 7], greedy(1), use_tqdm=False)[0].num_cached_tokens == 0


def test_whole_prompt_hit_recomputes_the_last_block():
    """test_prefix_caching.py::test_eagle_identical_prompt_hits_last_safe_block (without EAGLE:
    "the final block is recomputed to obtain logits") and test_scheduler.py::
    test_spec_decode_padding_first_decode_step (a repeated 33-token prompt has 32 tokens computed):
    a hit stops before the block holding the last prompt token."""
    llm = engine(10)
    for prompt, cached in ((COMMON, 2 * BS), ([7] * 33, 2 * BS), ([8] * 17, BS)):
        first, again = (llm.generate([prompt], greedy(1), use_tqdm=False)[0] for _ in range(2))
        assert (first.num_cached_tokens, again.num_cached_tokens) == (0, cached)


def test_prefix_cache_stats_are_recorded():
    """test_scheduler_e2e.py::test_prefix_cache_stats_is_recorded: 17 tokens, run twice; the
    second run is served its first block, 16 tokens, from the cache."""
    llm = engine(8)
    outs = [llm.generate([[101] * 17], greedy(4), use_tqdm=False)[0] for _ in range(2)]
    assert [o.num_cached_tokens for o in outs] == [0, 16]
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    assert llm.kv_stats()["prefix_hit_tokens"] == 16


# ---- the block pool's cases, on BlockPool and PrefixCache ------------------------------------


def _cache_chain(cache: PrefixCache, blocks: list, tokens: list[int], block_size: int) -> list[int]:
    """Publish ``blocks`` as the full blocks of ``tokens``, each after the one before."""
    hashes = chain_hashes(tokens, block_size)
    for i, block in enumerate(blocks):
        cache.insert(block, hashes[i], tokens[i * block_size : (i + 1) * block_size], blocks[i - 1] if i else None)
    return hashes


def test_cache_full_blocks_from_the_start_then_further():
    """test_prefix_caching.py::test_cache_blocks: caching 2 full blocks, then a third after them;
    the partial block (14 tokens, block size 4) is never hashed."""
    pool = BlockPool(5)
    cache = PrefixCache(pool)
    tokens = list(range(14))
    hashes = chain_hashes(tokens, 4)
    assert len(hashes) == 3
    blocks = pool.allocate(4)
    _cache_chain(cache, blocks[:2], tokens, 4)
    assert len(cache) == 2 and all(b.block_hash is not None for b in blocks[:2])
    cache.insert(blocks[2], hashes[2], tokens[8:12], parent=blocks[1])
    assert len(cache) == 3 and [b.block_hash for b in blocks] == [*hashes, None]
    assert cache.find(hashes, tokens, 4) == blocks[:3]


def test_salted_requests_share_only_with_the_same_salt():
    """test_prefix_caching.py::test_cache_key_salting, the salt as ``extra_key``: the same salt
    hits all 3 full blocks, another salt (or none) misses. Differs: the salt is in every block's
    hash (vLLM: only the first block's); a block filled by decoding is hashed the same way."""
    pool = BlockPool(11)
    cache = PrefixCache(pool)
    tokens = COMMON + [3] * 11
    hashes = chain_hashes(tokens, BS, extra_key="salt1")
    blocks = pool.allocate(4)
    for i in range(3):
        cache.insert(blocks[i], hashes[i], tokens[i * BS : (i + 1) * BS], blocks[i - 1] if i else None)
    grown = chain_hashes(tokens + [8] * 5, BS, known=hashes, extra_key="salt1")
    assert grown[3] == hash_block(hashes[2], [3] * 11 + [8] * 5, "salt1")

    other = COMMON + [4] * 11
    assert cache.find(chain_hashes(other, BS, extra_key="salt1"), other, BS) == blocks[:3]
    salt2 = chain_hashes(other, BS, extra_key="salt2")
    assert cache.find(salt2, other, BS) == [] and not set(salt2) & set(hashes)
    assert cache.find(chain_hashes(other, BS), other, BS) == []


def test_eviction_forgets_only_the_evicted_block():
    """test_prefix_caching.py::test_maybe_evict_cached_block: each eviction removes one block's
    hash and no other. (Its duplicate-hash half is test_duplicate_block_keeps_the_chain below.)"""
    pool = BlockPool(4)
    cache = PrefixCache(pool)
    tokens = list(range(12))
    blocks = pool.allocate(3)
    hashes = _cache_chain(cache, blocks, tokens, 4)
    pool.free(blocks)
    assert free_order(pool) == [3, 2, 1, 0]
    assert pool.allocate(1)[0].block_id == 3 and cache.num_evictions == 0
    for evicted, left in ((2, 2), (1, 1), (0, 0)):
        assert pool.allocate(1)[0].block_id == evicted
        assert set(cache.blocks) == set(hashes[:left]) and cache.find(hashes, tokens, 4) == blocks[:left]
    assert cache.num_evictions == 3


def test_lookup_by_hash_finds_the_block_inserted_under_it():
    """test_prefix_caching.py::test_block_lookup_cache_single_block_per_key: lookups by hash find
    the block inserted under it, nothing else; forgetting a block whose hash is cached under
    another block (vLLM: pop with the wrong block id) keeps the mapping."""
    pool = BlockPool(3)
    cache = PrefixCache(pool)
    x, y = [1, 2], [3, 4]
    kx, ky = chain_hashes(x, 2)[0], chain_hashes(y, 2)[0]
    b0, b1 = pool.allocate(2)
    assert cache.find([kx], x, 2) == [] and cache.find([ky], y, 2) == []
    cache.insert(b0, kx, x)
    assert cache.blocks == {kx: b0} and cache.find([kx], x, 2) == [b0] and cache.find([ky], y, 2) == []
    cache.insert(b1, ky, y)
    assert cache.find([kx], x, 2) == [b0] and cache.find([ky], y, 2) == [b1]
    stranger = pool.blocks[2]
    stranger.block_hash = kx
    cache.evict(stranger)
    assert cache.blocks == {kx: b0, ky: b1}
    stranger.block_hash = None
    pool.free([b0, b1])  # queued 2, 1, 0
    pool.allocate(2)  # blocks 2 and 1: b1 evicted
    assert cache.blocks == {kx: b0}
    pool.allocate(1)
    assert cache.blocks == {} and len(cache) == 0


def test_hit_needs_the_same_tokens_and_the_same_parent():
    """Differs on purpose from vLLM, which trusts the hash (its tests such as
    test_kv_cache_utils.py::test_hash_block_tokens pin what a hash covers): minipaged's 64-bit
    hash is confirmed by the block's tokens and by its parent, so a forged collision misses."""
    pool = BlockPool(4)
    cache = PrefixCache(pool)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    blocks = pool.allocate(2)
    hashes = _cache_chain(cache, blocks, a + b, 4)
    assert cache.find(hashes, a + b, 4) == blocks
    assert cache.find(hashes, a + [5, 6, 7, 9], 4) == blocks[:1]  # same hashes, other tokens
    assert cache.find(hashes, [0, 2, 3, 4] + b, 4) == []
    assert cache.find([hashes[1]], b, 4) == []  # b's tokens and hash, but not after a
    assert cache.find(chain_hashes([9] * 4 + b, 4), [9] * 4 + b, 4) == []


# ---- two bugs being fixed (vLLM's semantics; remove the marks once the fix lands) ------------


def test_duplicate_block_keeps_the_chain():
    """test_prefix_caching.py::test_block_lookup_cache_multi_blocks_per_key, ::test_maybe_evict_cached_block
    and ::test_prefill_plp: vLLM keeps every block computed for a hash (several blocks per key,
    "duplicate cached blocks have different ids but same hashes"), so a chain continued after the
    second copy is found. minipaged finds only the first block today."""
    cache = PrefixCache(BlockPool(4))
    x, y = [1, 2, 3, 4], [5, 6, 7, 8]
    h = chain_hashes(x + y, 4)
    a0, b0, b1 = cache.pool.allocate(3)
    cache.insert(a0, h[0], x)
    cache.insert(b0, h[0], x)  # the same prefix computed twice
    cache.insert(b1, h[1], y, parent=b0)
    assert len(cache.find(h, x + y, 4)) == 2


def test_evicting_one_copy_keeps_the_hash_served():
    """test_prefix_caching.py::test_maybe_evict_cached_block, its duplicate half: two blocks hold
    the same content under one hash; evicting one leaves the hash served by the other."""
    pool = BlockPool(4)
    cache = PrefixCache(pool)
    x = [1, 2, 3, 4]
    (h,) = chain_hashes(x, 4)
    first, second = pool.allocate(2)
    cache.insert(first, h, x)
    cache.insert(second, h, x)  # the same content computed twice
    pool.free([second, first])  # queued 2, 3, then first, then second
    assert [b.block_id for b in pool.allocate(3)] == [2, 3, first.block_id]
    assert cache.find([h], x, 4) == [second]
    pool.allocate(1)
    assert cache.find([h], x, 4) == [] and len(cache) == 0


def test_conversation_after_a_recomputed_block_is_served_from_the_cache():
    """The same through the engine, as vLLM's test_prefill_plp duplicate and
    test_scheduler_e2e.py::test_prefix_cache_stats_is_recorded measure it: P (48 tokens) is cached;
    P again recomputes its last block (a duplicate) and decodes 40 tokens; P + that answer + one
    token then hits every full block: 80 tokens in vLLM (48 in minipaged today)."""
    llm = engine(16)
    prompt = [97 + i % 26 for i in range(3 * BS)]
    llm.generate([prompt], greedy(1), use_tqdm=False)
    answer = llm.generate([prompt], greedy(40), use_tqdm=False)[0]
    assert answer.num_cached_tokens == 2 * BS
    follow_up = prompt + answer.outputs[0].token_ids + [65]
    assert llm.generate([follow_up], greedy(1), use_tqdm=False)[0].num_cached_tokens == 5 * BS
