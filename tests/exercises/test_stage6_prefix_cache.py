"""Stage 6 exercises: chained hashes, reusable prefix, LRU order, copy-on-write (notebook 06).

Checked against ``chain_hashes``, ``BlockPool`` and the engine's ``PagedKVManager``.
"""

from __future__ import annotations

import copy
import random

import pytest

from minipaged.engine.block_manager import PagedKVManager
from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.sequence import Sequence
from minipaged.kv.allocator import BlockPool
from minipaged.kv.block_table import BlockTable
from minipaged.kv.prefix_cache import ROOT_HASH, chain_hashes, hash_block
from minipaged.kv.slot_mapping import PagedKVCache

STAGE = "stage6_prefix_cache"


def manager(num_blocks: int, block_size: int, caching: bool) -> PagedKVManager:
    return PagedKVManager(PagedKVCache(1, num_blocks, block_size, 1, 1), caching, "torch")


@pytest.mark.exercise("chain_block_hashes")
def test_chain_block_hashes_matches_package(ex):
    rng = random.Random(0)
    for block_size in (1, 4, 16):
        for n in (0, block_size - 1, block_size, 3 * block_size + 2, 50):
            tokens = [rng.randrange(260) for _ in range(n)]
            want = chain_hashes(tokens, block_size)
            got = ex.chain_block_hashes(tokens, block_size)
            assert list(got) == want, (f"block size {block_size}, {n} tokens: {len(want)} full blocks, hashes "
                                       f"{[f'{h:x}' for h in want[:3]]}..., got {[f'{h:x}' for h in got[:3]]}...")


@pytest.mark.exercise("chain_block_hashes")
def test_chain_block_hashes_position_matters(ex):
    """Notebook 06: 'one two one two' in blocks of 4 — blocks 0 and 2 hold the same tokens, not the same hash."""
    tokens = list(b"one two one two on")
    got = ex.chain_block_hashes(tokens, 4)
    assert len(got) == 4, "four full blocks, the partial 'on' gets no hash"
    assert got[0] == hash_block(ROOT_HASH, list(b"one "))
    assert got[0] != got[2], "a block's hash covers everything before it"
    assert got[2] == hash_block(got[1], list(b"one "))


def cache_after(prompts: list[list[int]], block_size: int) -> PagedKVManager:
    """A prefix-caching manager that has computed ``prompts`` one after the other, then freed them."""
    kv = manager(256, block_size, caching=True)
    for i, prompt in enumerate(prompts):
        seq = Sequence(i, prompt, SamplingParams(), block_size)
        kv.match_prefix(seq)
        kv.allocate(seq, len(seq) - seq.num_computed_tokens)  # full blocks are published here
        kv.free(seq)  # free, but still cached
    return kv


def engine_reuse(kv: PagedKVManager, prompt: list[int], block_size: int) -> int:
    seq = Sequence(999, prompt, SamplingParams(), block_size)
    hit = kv.match_prefix(seq)
    kv.undo_match(seq)
    return hit


def as_dict(kv: PagedKVManager) -> dict[int, tuple[int, ...]]:
    cache = kv.prefix_cache
    return {h: cache.tokens[block.block_id] for h, block in cache.blocks.items()}


@pytest.mark.exercise("reusable_prefix_tokens")
@pytest.mark.parametrize("block_size", [4, 16])
def test_reusable_prefix_tokens_matches_engine(ex, block_size):
    rng = random.Random(block_size)
    system = [rng.randrange(256) for _ in range(40)]
    own = [[rng.randrange(256) for _ in range(rng.randint(1, 30))] for _ in range(4)]
    seen = [system + own[0], system + own[1], system[:32], system[:7]]
    kv = cache_after(seen, block_size)
    cached = as_dict(kv)
    queries = {
        "same system prompt, new text": system + own[2],
        "an earlier prompt again (whole-prompt hit)": seen[0],
        "an earlier prompt plus one token": seen[0] + [1],
        "exactly 32 tokens seen before": system[:32],
        "32 seen tokens + 1": system[:33],
        "a prompt shorter than a block": system[:3],
        "different first token": [system[0] + 1] + system[1:],
        "nothing in common": own[3],
    }
    for what, prompt in queries.items():
        want = engine_reuse(kv, prompt, block_size)
        got = ex.reusable_prefix_tokens(prompt, block_size, cached)
        assert got == want, f"block size {block_size}, {what} ({len(prompt)} tokens): engine reuses {want}, got {got}"


@pytest.mark.exercise("reusable_prefix_tokens")
def test_reusable_prefix_tokens_whole_prompt_rule(ex):
    prompt = list(range(48))
    hashes = chain_hashes(prompt, 16)
    cached = {h: tuple(prompt[i * 16 : (i + 1) * 16]) for i, h in enumerate(hashes)}
    assert ex.reusable_prefix_tokens(prompt, 16, cached) == 32, "48 tokens seen before: the last block is recomputed"
    assert ex.reusable_prefix_tokens(prompt + [7], 16, cached) == 48
    assert ex.reusable_prefix_tokens(prompt[:16], 16, cached) == 0, "one block, holding the last token: nothing"
    assert ex.reusable_prefix_tokens(prompt[:17], 16, cached) == 16


@pytest.mark.exercise("reusable_prefix_tokens")
def test_reusable_prefix_tokens_checks_tokens(ex):
    """A hash whose stored tokens differ (a collision) is a miss, and the walk stops there."""
    prompt = list(range(40))
    hashes = chain_hashes(prompt, 8)
    cached = {h: tuple(prompt[i * 8 : (i + 1) * 8]) for i, h in enumerate(hashes)}
    assert ex.reusable_prefix_tokens(prompt, 8, cached) == 32
    forged = dict(cached)
    forged[hashes[2]] = tuple(range(100, 108))
    assert ex.reusable_prefix_tokens(prompt, 8, forged) == 16, "block 2's stored tokens differ: stop before it"
    forged[hashes[0]] = tuple(range(100, 108))
    assert ex.reusable_prefix_tokens(prompt, 8, forged) == 0
    del cached[hashes[1]]
    assert ex.reusable_prefix_tokens(prompt, 8, cached) == 8, "block 1 is missing: blocks 2 and 3 cannot be used"


def pool_order(free_queue: list[int], finished: list[list[int]], num_blocks: int) -> list[int]:
    """BlockPool's answer: every block held, then free_queue freed in order, then each table."""
    pool = BlockPool(num_blocks)
    pool.allocate(num_blocks)
    for block_id in free_queue:
        pool.free([block_id])
    for table in finished:
        pool.free(table)
    pool.check_invariants()
    return [b.block_id for b in pool.free_queue]


@pytest.mark.exercise("evict_order")
def test_evict_order_example(ex):
    assert list(ex.evict_order([5], [[0, 1, 2], [3, 4]])) == [5, 2, 1, 0, 4, 3]
    assert list(ex.evict_order([], [[7, 3]])) == [3, 7], "notebook 06: A = [7, 3] gives back 3 before 7"
    assert list(ex.evict_order([1, 2], [])) == [1, 2]


@pytest.mark.exercise("evict_order")
def test_evict_order_matches_block_pool(ex):
    rng = random.Random(0)
    for _ in range(30):
        ids = list(range(rng.randint(1, 20)))
        rng.shuffle(ids)
        cut = sorted(rng.sample(range(len(ids) + 1), 3))
        free_queue, rest = ids[: cut[0]], ids[cut[0] :]
        finished, start = [], 0
        for size in (cut[1] - cut[0], cut[2] - cut[1], len(rest) - (cut[2] - cut[0])):
            finished.append(rest[start : start + size])
            start += size
        finished = [t for t in finished if t]
        want = pool_order(free_queue, finished, len(ids))
        got = ex.evict_order(list(free_queue), copy.deepcopy(finished))
        assert list(got) == want, f"free_queue {free_queue}, finished {finished}: BlockPool gives {want}, got {got}"


def engine_cow(tables, ref_cnt, free_queue, idx, block_size=4):
    """The engine's answer: PagedKVManager.allocate, one new token per sequence, in table order."""
    num_blocks = 1 + max([b for t in tables for b in t] + list(free_queue) + list(ref_cnt))
    kv = manager(num_blocks, block_size, caching=False)
    pool = kv.pool
    pool.allocate(num_blocks)  # everything held ...
    for block_id in free_queue:  # ... except the free queue, in its order
        pool.free([block_id])
    for block_id, count in ref_cnt.items():
        for _ in range(count - 1):
            pool.share(block_id)
    seqs = []
    for k, table in enumerate(tables):
        held = idx * block_size + 1 + k % (block_size - 1)  # block idx partly filled
        seq = Sequence(k, list(range(held + 1)), SamplingParams(), block_size)
        seq.block_table = BlockTable.from_blocks(table, held, block_size)
        seq.num_computed_tokens = held
        seqs.append(seq)
    for seq in seqs:
        kv.allocate(seq, 1)  # writes position `held`, in logical block idx
    return [seq.block_table.block_ids for seq in seqs]


@pytest.mark.exercise("copy_on_write")
def test_copy_on_write_example(ex):
    args = ([[7, 3], [7, 3], [7, 3]], {7: 3, 3: 3}, [9, 0], 1)
    frozen = copy.deepcopy(args)
    got = ex.copy_on_write(*args)
    assert [list(t) for t in got] == [[7, 9], [7, 0], [7, 3]]
    assert args == frozen, "do not change the arguments"
    assert engine_cow(*frozen) == [[7, 9], [7, 0], [7, 3]]  # the engine agrees


@pytest.mark.exercise("copy_on_write")
def test_copy_on_write_cases(ex):
    cases = {
        "nothing shared: everyone writes in place": ([[1, 2], [3, 4]], {1: 1, 2: 1, 3: 1, 4: 1}, [5, 6], 1),
        "a block held by someone else too: both copy": ([[1, 2], [3, 2]], {1: 1, 2: 3, 3: 1}, [7, 8, 9], 1),
        "two shared groups": ([[1, 2], [1, 2], [1, 3], [1, 3]], {1: 4, 2: 2, 3: 2}, [6, 5, 4], 1),
        "idx 0": ([[4], [4], [2]], {4: 2, 2: 1}, [0, 1], 0),
    }
    for what, args in cases.items():
        want = engine_cow(*copy.deepcopy(args))
        got = ex.copy_on_write(*copy.deepcopy(args))
        assert [list(t) for t in got] == want, f"{what}: {args} -> the engine gives {want}, got {got}"


@pytest.mark.exercise("copy_on_write")
def test_copy_on_write_matches_engine(ex):
    rng = random.Random(1)
    for _ in range(40):
        idx = rng.randint(0, 2)
        ids = list(range(30))
        rng.shuffle(ids)
        prefix = [ids.pop() for _ in range(idx)]  # shared full blocks before idx
        tails = [ids.pop() for _ in range(rng.randint(1, 3))]
        tables = [prefix + [rng.choice(tails)] for _ in range(rng.randint(1, 5))]
        ref_cnt = {b: len(tables) for b in prefix}
        for b in tails:
            users = sum(t[idx] == b for t in tables)
            if users:
                ref_cnt[b] = users + rng.choice([0, 0, 1])  # sometimes also held outside these tables
        free_queue = [ids.pop() for _ in range(len(tables))]
        want = engine_cow(copy.deepcopy(tables), dict(ref_cnt), list(free_queue), idx)
        got = ex.copy_on_write(copy.deepcopy(tables), dict(ref_cnt), list(free_queue), idx)
        assert [list(t) for t in got] == want, (f"tables {tables}, ref_cnt {ref_cnt}, free_queue {free_queue}, "
                                                f"idx {idx}: the engine gives {want}, got {got}")
