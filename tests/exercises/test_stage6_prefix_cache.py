"""Stage 6 exercises: chained hashes, reusable prefix, LRU order, copy-on-write (notebook 06).

Checked against ``chain_hashes``, the definition of a reusable prefix (the longest common prefix
with a prompt seen before, in whole blocks), and ``BlockPool``'s free queue and reference counts.
"""

from __future__ import annotations

import copy
import random

import pytest

from minipaged.kv.block_pool import BlockPool
from minipaged.kv.prefix_cache import ROOT_HASH, chain_hashes, hash_block

STAGE = "stage6_prefix_cache"


@pytest.mark.exercise("chain_block_hashes")
def test_chain_block_hashes_matches_package(ex):
    rng = random.Random(0)
    for block_size in (1, 4, 16):
        for n in (0, block_size - 1, block_size, 3 * block_size + 2, 50):
            tokens = [rng.randrange(260) for _ in range(n)]
            want = chain_hashes(tokens, block_size)
            got = ex.chain_block_hashes(tokens, block_size)
            assert list(got) == want, (
                f"block size {block_size}, {n} tokens: {len(want)} full blocks, hashes "
                f"{[f'{h:x}' for h in want[:3]]}..., got {[f'{h:x}' for h in got[:3]]}..."
            )


@pytest.mark.exercise("chain_block_hashes")
def test_chain_block_hashes_position_matters(ex):
    """Notebook 06: 'one two one two' in blocks of 4 — blocks 0 and 2 hold the same tokens, not the same hash."""
    tokens = list(b"one two one two on")
    got = ex.chain_block_hashes(tokens, 4)
    assert len(got) == 4, "four full blocks, the partial 'on' gets no hash"
    assert got[0] == hash_block(ROOT_HASH, list(b"one "))
    assert got[0] != got[2], "a block's hash covers everything before it"
    assert got[2] == hash_block(got[1], list(b"one "))


def cached_after(prompts: list[list[int]], block_size: int) -> dict[int, tuple[int, ...]]:
    """The cache once ``prompts`` have been computed: every full block, by chained hash."""
    cached = {}
    for prompt in prompts:
        for i, h in enumerate(chain_hashes(prompt, block_size)):
            cached[h] = tuple(prompt[i * block_size : (i + 1) * block_size])
    return cached


def reuse_by_definition(prompt: list[int], seen: list[list[int]], block_size: int) -> int:
    """The longest prefix shared with a prompt seen before, in its full blocks, never the last token's block."""
    best = 0
    for other in seen:
        common = next((i for i, (a, b) in enumerate(zip(prompt, other)) if a != b), min(len(prompt), len(other)))
        best = max(best, min(common, len(other)) // block_size)
    return min(best, (len(prompt) - 1) // block_size) * block_size


@pytest.mark.exercise("reusable_prefix_tokens")
@pytest.mark.parametrize("block_size", [4, 16])
def test_reusable_prefix_tokens_shared_system_prompt(ex, block_size):
    rng = random.Random(block_size)
    system = [rng.randrange(256) for _ in range(40)]
    own = [[rng.randrange(256) for _ in range(rng.randint(1, 30))] for _ in range(4)]
    seen = [system + own[0], system + own[1], system[:32], system[:7]]
    cached = cached_after(seen, block_size)
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
        want = reuse_by_definition(prompt, seen, block_size)
        got = ex.reusable_prefix_tokens(prompt, block_size, dict(cached))
        assert got == want, f"block size {block_size}, {what} ({len(prompt)} tokens): {want} reusable, got {got}"


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


def pool_cow(tables, ref_cnt, free_queue, idx):
    """The same writes on a real ``BlockPool``: a shared block is replaced by a newly allocated one."""
    num_blocks = 1 + max([b for t in tables for b in t] + list(free_queue) + list(ref_cnt))
    pool = BlockPool(num_blocks)
    pool.allocate(num_blocks)  # everything held ...
    for block_id in free_queue:  # ... except the free queue, in its order
        pool.free([block_id])
    for block_id, count in ref_cnt.items():
        for _ in range(count - 1):
            pool.share(block_id)
    out = []
    for table in tables:
        table = list(table)
        if pool.blocks[table[idx]].ref_cnt > 1:
            new = pool.allocate(1)[0].block_id
            pool.free([table[idx]])
            table[idx] = new
        out.append(table)
    pool.check_invariants()
    return out


@pytest.mark.exercise("copy_on_write")
def test_copy_on_write_example(ex):
    args = ([[7, 3], [7, 3], [7, 3]], {7: 3, 3: 3}, [9, 0], 1)
    frozen = copy.deepcopy(args)
    got = ex.copy_on_write(*args)
    want = [[7, 9], [7, 0], [7, 3]]
    assert [list(t) for t in got] == want, f"notebook 06's example, copy_on_write{frozen}: want {want}, got {got}"
    assert args == frozen, "do not change the arguments"


@pytest.mark.exercise("copy_on_write")
def test_copy_on_write_cases(ex):
    cases = {  # what: (tables, ref_cnt, free_queue, idx), want
        "nothing shared: everyone writes in place": (
            ([[1, 2], [3, 4]], {1: 1, 2: 1, 3: 1, 4: 1}, [5, 6], 1),
            [[1, 2], [3, 4]],
        ),
        "a block held by someone else too: both copy": (
            ([[1, 2], [3, 2]], {1: 1, 2: 3, 3: 1}, [7, 8, 9], 1),
            [[1, 7], [3, 8]],
        ),
        "two shared groups: the last user of each writes in place": (
            ([[1, 2], [1, 2], [1, 3], [1, 3]], {1: 4, 2: 2, 3: 2}, [6, 5, 4], 1),
            [[1, 6], [1, 2], [1, 5], [1, 3]],
        ),
        "idx 0": (([[4], [4], [2]], {4: 2, 2: 1}, [0, 1], 0), [[0], [4], [2]]),
    }
    for what, (args, want) in cases.items():
        assert pool_cow(*copy.deepcopy(args)) == want  # BlockPool agrees
        got = ex.copy_on_write(*copy.deepcopy(args))
        assert [list(t) for t in got] == want, f"{what}: copy_on_write{args}: want {want}, got {got}"


@pytest.mark.exercise("copy_on_write")
def test_copy_on_write_matches_block_pool(ex):
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
        want = pool_cow(copy.deepcopy(tables), dict(ref_cnt), list(free_queue), idx)
        got = ex.copy_on_write(copy.deepcopy(tables), dict(ref_cnt), list(free_queue), idx)
        assert [list(t) for t in got] == want, (
            f"tables {tables}, ref_cnt {ref_cnt}, free_queue {free_queue}, idx {idx}: BlockPool gives {want}, got {got}"
        )
