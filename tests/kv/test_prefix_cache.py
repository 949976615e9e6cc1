"""Stage 6: prefix caching — hashing, hits, LRU eviction, and identical output with caching on/off."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from modelkit import random_prompts

from minipaged import LLM, SamplingParams
from minipaged.kv.block_pool import BlockPool
from minipaged.kv.prefix_cache import ROOT_HASH, PrefixCache, chain_hashes, hash_block

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def test_hash_is_stable_and_chained():
    # A fixed value: the same in every process and on every machine (notebook outputs rely on it).
    assert hash_block(ROOT_HASH, [1, 2, 3, 4]) == hash_block(0, (1, 2, 3, 4)) == 0x2728AB4454AAA05B
    a = chain_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    assert len(a) == 3  # only full blocks
    b = chain_hashes([9, 9, 3, 4, 5, 6], 2)
    assert a[0] != b[0] and a[1] != b[1]  # same tokens [3, 4], different parent
    assert chain_hashes([1, 2, 3, 4, 5, 6], 2, known=a[:1]) == a
    assert hash_block(0, [1, 2], extra_key="lora-1") != hash_block(0, [1, 2])


def test_lookup_confirms_tokens_so_collisions_never_share():
    pool = BlockPool(4)
    cache = PrefixCache(pool)
    block = pool.allocate(1)[0]
    cache.insert(block, 12345, [1, 2])
    assert cache.lookup([12345], [3, 4], 2) == []  # same hash, other tokens: a miss
    assert cache.lookup([12345], [1, 2], 2) == [block] and block.ref_cnt == 2


def test_eviction_order_and_hash_reuse():
    """Freed cached blocks wait in LRU order (a request's tail first) and are revived by hits."""
    pool = BlockPool(4)
    cache = PrefixCache(pool)
    tokens = [1, 2, 3, 4, 5, 6]
    blocks = pool.allocate(3)  # blocks 0, 1, 2 hold A's three full blocks
    hashes = chain_hashes(tokens, 2)
    for i, b in enumerate(blocks):
        cache.insert(b, hashes[i], tokens[2 * i : 2 * i + 2], blocks[i - 1] if i else None)
    pool.free(blocks)
    assert [b.block_id for b in pool.free_queue] == [3, 2, 1, 0]  # never-used first, then A's tail
    assert len(cache) == 3
    # B shares A's first two blocks: they leave the free queue, the tail stays evictable.
    hits = cache.lookup(chain_hashes([1, 2, 3, 4, 9, 9], 2), [1, 2, 3, 4, 9, 9], 2)
    assert [b.block_id for b in hits] == [0, 1] and [b.ref_cnt for b in hits] == [1, 1]
    assert [b.block_id for b in pool.free_queue] == [3, 2]
    new = pool.allocate(2)  # takes the never-used block 3, then evicts A's tail block 2
    assert [b.block_id for b in new] == [3, 2] and cache.num_evictions == 1
    assert len(cache) == 2 and hashes[2] not in cache.blocks and new[1].block_hash is None
    pool.free(hits + new)
    pool.check_invariants()


@pytest.fixture(scope="module")
def shared_prompts():
    """Prompts sharing prefixes of many lengths with block size 4: 0, 3, 4 (one block), 8, 9, the whole prompt."""
    base = random_prompts(1, seed=11, min_len=24, max_len=24)[0]
    tails = random_prompts(8, seed=12, min_len=1, max_len=6)
    return [base[:k] + t for k, t in zip([0, 3, 4, 8, 9, 12, 16, 20], tails)] + [base, base[:12], base[:12], base]


@pytest.mark.parametrize("kwargs", [dict(), dict(num_kvcache_blocks=9, max_num_batched_tokens=6)])
@pytest.mark.slow
def test_greedy_identical_with_caching_on_and_off(tiny_model_dir, shared_prompts, kwargs):
    off = LLM(tiny_model_dir, max_model_len=64, block_size=4, **kwargs)
    on = LLM(tiny_model_dir, max_model_len=64, block_size=4, enable_prefix_caching=True, **kwargs)
    want = [o.outputs[0].token_ids for o in off.generate(shared_prompts, GREEDY, use_tqdm=False)]
    # One by one, so that every later prompt can hit what earlier ones cached.
    got = [on.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in shared_prompts]
    assert got == want
    stats = on.kv_stats()
    assert stats["prefix_hit_tokens"] > 0
    assert stats["prefill_tokens_computed"] < off.kv_stats()["prefill_tokens_computed"]
    on.kv_manager.pool.check_invariants()
    assert on.kv_manager.pool.num_free_blocks == on.num_blocks


@pytest.mark.slow
def test_whole_prompt_hit_still_computes_the_last_token(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=4, enable_prefix_caching=True)
    prompt = random_prompts(1, seed=4, min_len=16, max_len=16)[0]  # exactly 4 full blocks
    first = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    again = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert again.num_cached_tokens == 12  # the block with the last token is recomputed, never written shared
    longer = llm.generate([prompt + [5]], GREEDY, use_tqdm=False)[0]
    assert longer.num_cached_tokens == 16


@pytest.mark.slow
def test_preempted_sequence_finds_its_own_blocks(tiny_model_dir):
    prompts = random_prompts(6, seed=21, min_len=20, max_len=30)
    off = LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=12)
    on = LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=12, enable_prefix_caching=True)
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in on.generate(prompts, sp, use_tqdm=False)] == [
        o.outputs[0].token_ids for o in off.generate(prompts, sp, use_tqdm=False)
    ]
    stats = on.kv_stats()
    assert stats["num_preemptions"] > 0 and stats["resumed_hit_tokens"] > 0  # resumed from their own blocks


def live_sharing_is_consistent(llm: LLM) -> None:
    """Every used block's ref_cnt equals the number of live block tables that hold it, and a
    block shared by several sequences holds the same tokens in each of them."""
    pool, bs = llm.kv_manager.pool, llm.block_size
    holders: dict[int, list[tuple[int, list[int]]]] = {}
    for seq in llm.scheduler.running:
        for i, b in enumerate(seq.block_table.block_ids):
            holders.setdefault(b, []).append((i, seq.token_ids[i * bs : min((i + 1) * bs, seq.num_computed_tokens)]))
    for block in pool.blocks:
        assert block.ref_cnt == len(holders.get(block.block_id, [])), block
    for entries in holders.values():
        filled = [toks for _, toks in entries if toks]
        shortest = min((len(t) for t in filled), default=0)
        assert len({tuple(t[:shortest]) for t in filled}) <= 1


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(8, 40),
    block_size=st.sampled_from([2, 4, 8]),
    n_requests=st.integers(1, 8),
    budget=st.sampled_from([5, 16, 2048]),
)
@pytest.mark.slow
def test_random_shared_prefix_mixes(tiny_model_dir, seed, num_blocks, block_size, n_requests, budget):
    import random

    rng = random.Random(seed)
    base = random_prompts(1, seed, min_len=30, max_len=30)[0]
    prompts = [base[: rng.randint(0, 30)] + random_prompts(1, seed + i + 1, 1, 8)[0] for i in range(n_requests)]
    params = [
        SamplingParams(temperature=0, max_tokens=rng.randint(1, 6), ignore_eos=True, n=rng.choice([1, 1, 2]))
        for _ in prompts
    ]
    total = max(len(p) + sp.max_tokens for p, sp in zip(prompts, params))
    num_blocks = max(num_blocks, -(-total // block_size))
    kw = dict(max_model_len=64, block_size=block_size, num_kvcache_blocks=num_blocks, max_num_batched_tokens=budget)
    on = LLM(tiny_model_dir, enable_prefix_caching=True, **kw)
    rids = [on.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while on.has_unfinished_requests():
        done.update((o.request_id, [c.token_ids for c in o.outputs]) for o in on.step() if o.finished)
        live_sharing_is_consistent(on)
        on.kv_manager.pool.check_invariants()
    assert sorted(done) == rids  # never a lost request
    assert on.kv_manager.pool.num_free_blocks == num_blocks  # never a leak
    off = LLM(tiny_model_dir, **kw)
    want = [[c.token_ids for c in o.outputs] for o in off.generate(prompts, params, use_tqdm=False)]
    assert [done[r] for r in rids] == want


@pytest.mark.slow
def test_a_hash_collision_costs_a_miss_never_wrong_kv(tiny_model_dir, monkeypatch):
    """Force collisions: a hash that ignores the parent block. B's second block then has the same
    hash and tokens as A's, but A computed it after other tokens: sharing it would be wrong K/V."""
    from minipaged.kv import prefix_cache

    monkeypatch.setattr(prefix_cache, "hash_block", lambda parent, tokens, extra=None: hash(tuple(tokens)))
    bs = 4
    shared_tail = [7, 8, 9, 10]
    a = [1, 2, 3, 4] + shared_tail + [11, 12]  # publishes [1..4] and shared_tail after it
    c = [5, 6, 5, 6] + [13, 14]  # publishes [5, 6, 5, 6]
    b = [5, 6, 5, 6] + shared_tail + [15, 16]  # hits [5, 6, 5, 6]; shared_tail collides with A's
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    on = LLM(tiny_model_dir, max_model_len=64, block_size=bs, num_kvcache_blocks=32, enable_prefix_caching=True)
    off = LLM(tiny_model_dir, max_model_len=64, block_size=bs, num_kvcache_blocks=32)
    for p in (a, c):
        on.generate([p], sp, use_tqdm=False)
    got = on.generate([b], sp, use_tqdm=False)[0]
    assert got.num_cached_tokens == 4  # [5, 6, 5, 6] only: the colliding block is a miss
    assert got.outputs[0].token_ids == off.generate([b], sp, use_tqdm=False)[0].outputs[0].token_ids


def test_parent_check_in_lookup():
    pool = BlockPool(4)
    cache = PrefixCache(pool)
    x, y, z = pool.allocate(3)
    assert cache.insert(x, 1, [1, 2]) and cache.insert(y, 2, [3, 4], parent=x)
    assert not cache.insert(z, 3, [5, 6], parent=pool.blocks[3])  # a private parent: stays private
    assert [b.block_id for b in cache.lookup([1, 2], [1, 2, 3, 4], 2)] == [x.block_id, y.block_id]
    assert cache.lookup([2], [3, 4], 2) == []  # y's tokens, but y follows x, not the root


def test_a_second_copy_of_a_cached_block_does_not_break_the_chain():
    """A block computed twice (its hash already cached) used to keep every later block private."""
    cache = PrefixCache(BlockPool(3))
    x, y = [1, 2, 3, 4], [5, 6, 7, 8]
    h = chain_hashes(x + y, 4)
    a0, b0, b1 = cache.pool.allocate(3)
    assert cache.insert(a0, h[0], x) and cache.insert(b0, h[0], x) and cache.insert(b1, h[1], y, parent=b0)
    assert cache.find(h, x + y, 4) == [a0, b1]  # through the first copy of x, then b1
    assert len(cache) == 2 and cache.copies == {h[0]: [b0]}
    cache.pool.free([a0])
    (again,) = cache.pool.allocate(1)  # a0 is reused for other tokens: the copy takes its place
    assert again is a0 and cache.num_evictions == 1
    assert cache.find(h, x + y, 4) == [b0, b1] and not cache.copies


def test_a_second_copy_of_other_content_under_the_same_hash_stays_private():
    cache = PrefixCache(BlockPool(3))
    a, b, c = cache.pool.allocate(3)
    assert cache.insert(a, 777, [1, 2])
    assert not cache.insert(b, 777, [3, 4])  # a collision: the hash names other tokens
    assert not cache.insert(c, 778, [5, 6], parent=b)  # and nothing can chain on from b
    assert b.block_hash is None and c.block_hash is None and cache.find([777], [1, 2], 2) == [a]


def test_a_prompt_computed_again_still_publishes_the_answer_that_follows_it():
    """End to end: P (3 full blocks) is cached, P again recomputes its last block (a second copy),
    and the 40 answer tokens that follow must still be reachable: P + answer + 1 token hits 80."""
    llm = LLM(enable_prefix_caching=True, num_kvcache_blocks=64, block_size=16, max_model_len=256)
    prompt = [(7 * i + 3) % 200 + 5 for i in range(48)]
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    first = llm.generate([prompt], sp, use_tqdm=False)[0]
    again = llm.generate([prompt], sp, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 32  # the last block is recomputed
    follow_up = prompt + again.outputs[0].token_ids + [9]
    out = llm.generate([follow_up], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert out.num_cached_tokens == 80


def test_num_cached_tokens_is_set_once_at_first_scheduling_not_on_resume():
    """Two requests that cannot both fit: one is preempted and resumes on its own published blocks.
    vLLM sets ``num_cached_tokens`` once; it used to report the resumed blocks (48 of a 20-token prompt)."""
    llm = LLM(enable_prefix_caching=True, num_kvcache_blocks=8, max_model_len=256)
    sp = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    a = llm.add_request([97 + i % 26 for i in range(20)], sp)
    b = llm.add_request([65 + i % 26 for i in range(20)], sp)
    while llm.has_unfinished_requests():
        llm.step()
    assert llm.kv_stats()["num_preemptions"] >= 1
    assert llm.get_output(a).num_cached_tokens == 0 and llm.get_output(b).num_cached_tokens == 0


def test_reset_prefix_cache_waits_until_no_block_is_in_use():
    llm = LLM(enable_prefix_caching=True, num_kvcache_blocks=32, block_size=4, max_model_len=64)
    prompt = list(range(10, 30))
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate([prompt], sp, use_tqdm=False)
    cached = llm.kv_stats()["cached_blocks"]
    assert cached == 5
    running = llm.add_request(prompt, sp)
    llm.step()  # it holds blocks now
    assert llm.reset_prefix_cache() is False and llm.kv_stats()["cached_blocks"] == cached
    llm.abort_request(running)
    assert llm.reset_prefix_cache() is True and llm.kv_stats()["cached_blocks"] == 0
    assert all(b.block_hash is None for b in llm.kv_manager.pool.blocks)
    assert llm.generate([prompt], sp, use_tqdm=False)[0].num_cached_tokens == 0
