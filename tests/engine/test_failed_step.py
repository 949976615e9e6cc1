"""A failed step leaves no trace: whatever raises inside ``step()``, a later ``step()`` or
``abort_request()`` gives every request the tokens it would have had, and every block comes back.

The regression tests rebuild, on purpose, the ways a step used to corrupt the engine; the random
tests inject thousands of faults into random workloads on fixed and on randomly drawn
configurations (tight pools with prefix caching, n up to 4, both torch-side backends) and check
every fork as it happens, the pools after every step, the cached K/V every few steps and every
output at the end.
"""

from __future__ import annotations

import random
import zlib

import pytest
from faults import Boom, check_cached_kv, check_pool, fail_in_layer, fail_in_sampling, watch_forks

from minipaged import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


def alone(llm_args: dict, model, prompt, params) -> list[list[int]]:
    llm = LLM(model, **llm_args)
    return [o.token_ids for o in llm.generate([prompt], params, use_tqdm=False)[0].outputs]


def drain(llm: LLM) -> None:
    while llm.has_unfinished_requests():
        llm.step()
        check_pool(llm)


def tokens_of(llm: LLM, rid: int) -> list[list[int]]:
    return [o.token_ids for o in llm.get_output(rid).outputs]


def test_interrupted_sampling_is_given_back():
    """Ctrl-C in sampling used to leave the step's tokens counted as computed: the request then
    sampled another row's logits ([80, 95, 80, 56, 80] instead of [76] * 5)."""
    llm = LLM(num_kvcache_blocks=64, block_size=4)
    a = llm.add_request([10, 20, 30, 40, 50], GREEDY)
    fail_in_sampling(llm, after_draw=False, exc=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.step()
    assert llm.failed_request_ids == [a]
    b = llm.add_request([60, 70, 80, 90], GREEDY)
    drain(llm)
    args = dict(num_kvcache_blocks=64, block_size=4)
    assert tokens_of(llm, a) == alone(args, None, [10, 20, 30, 40, 50], GREEDY) == [[76] * 5]
    assert tokens_of(llm, b) == alone(args, None, [60, 70, 80, 90], GREEDY)
    assert llm.kv_manager.pool.num_free_blocks == 64


@pytest.mark.parametrize("then", ["retry", "abort the publisher"])
def test_no_prefix_hit_survives_on_blocks_a_failed_step_never_wrote(tiny_model_dir, then):
    """P publishes its prompt's blocks and S, admitted in the same step, hits them; the step fails."""
    args = dict(max_model_len=64, block_size=4, num_kvcache_blocks=32, enable_prefix_caching=True)
    llm = LLM(tiny_model_dir, **args)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    p, s = llm.add_request(prompt, GREEDY), llm.add_request(prompt, GREEDY)
    fail_in_layer(llm, layer=1, after_store=True)
    with pytest.raises(Boom):
        llm.step()
    sharer = llm._requests[s].seqs[0]
    assert sharer.num_cached_tokens is None  # the failed step's hit on P's unwritten blocks is undone
    assert sharer.num_computed_tokens == 0 and not sharer.block_table.block_ids
    assert llm.kv_stats()["cached_blocks"] == 0  # withdrawn
    if then == "abort the publisher":
        llm.abort_request(p)
    drain(llm)
    want = alone(args, tiny_model_dir, prompt, GREEDY)
    assert tokens_of(llm, s) == want
    if then == "retry":
        assert tokens_of(llm, p) == want
    assert llm.kv_manager.pool.num_free_blocks == 32


def test_no_copy_on_write_is_replayed_from_a_block_that_changed(tiny_model_dir):
    """a (n=2) owes a copy of its shared tail T; in the same schedule T's other holder is
    preempted, T goes to B, and the failing forward writes B's layer-0 K/V into T."""
    args = dict(max_model_len=64, block_size=4, num_kvcache_blocks=5, max_num_seqs=4)
    llm = LLM(tiny_model_dir, **args)
    two = SamplingParams(temperature=1.0, seed=7, n=2, max_tokens=4, ignore_eos=True)
    a = llm.add_request([5, 6, 7, 8, 9, 10], two)  # 2 blocks, the second half full: shared after the fork
    b = llm.add_request([11, 12, 13, 14, 15, 16, 17, 18], GREEDY)  # 2 full blocks: needs a third next step
    llm.step()  # both prefilled; a forks
    seq_b, seen = llm._requests[b].seqs[0], []
    run = llm.runner.run

    def recording_run(batch):
        seen.append(
            (list(batch.blocks_to_copy), [q.sample_index for q in batch.preempted], seq_b.block_table.block_ids[-1])
        )
        return run(batch)

    llm.runner.run = recording_run
    fail_in_layer(llm, layer=1, after_store=True)
    with pytest.raises(Boom):
        llm.step()
    del llm.runner.run
    ((src, _),), preempted, b_last = seen[0]
    assert preempted == [1] and b_last == src  # a's sample 1 lost its blocks, and the copy's source went to B
    assert sorted(llm.failed_request_ids) == [a, b]
    drain(llm)
    assert tokens_of(llm, a) == alone(args, tiny_model_dir, [5, 6, 7, 8, 9, 10], two)
    assert tokens_of(llm, b) == alone(args, tiny_model_dir, [11, 12, 13, 14, 15, 16, 17, 18], GREEDY)
    assert llm.kv_manager.pool.num_free_blocks == 5


def random_request(
    rng: random.Random, prefixes: list[list[int]], longest: int, most_n: int
) -> tuple[list[int], SamplingParams]:
    """A prompt of up to ``longest`` tokens (often a shared prefix's start), greedy or n = 1..most_n."""
    own = rng.randint(1, max(1, min(10, longest // 4)))
    prompt = rng.choice(prefixes)[: rng.randint(0, longest - own)] + [rng.randrange(97) for _ in range(own)]
    if rng.random() < 0.4:
        return prompt, SamplingParams(temperature=0, max_tokens=rng.randint(1, 8), ignore_eos=True)
    n = rng.randint(1, most_n)
    return prompt, SamplingParams(
        temperature=1.0, top_k=20, seed=rng.randrange(1000), n=n, max_tokens=rng.randint(1, 8)
    )


def inject(llm: LLM, rng: random.Random, layers: int) -> None:
    kind = rng.random()
    exc = KeyboardInterrupt if rng.random() < 0.3 else Boom
    if kind < 0.6:
        fail_in_layer(llm, rng.randrange(layers), after_store=rng.random() < 0.5, exc=exc)
    else:
        fail_in_sampling(llm, after_draw=rng.random() < 0.5, exc=exc)


def episode(model, config: dict, seed: int, steps_wanted: int = 600, fault_rate: float = 0.25) -> dict:
    """One random workload with faults; checked after every step (pools, forks), every few
    steps (cached K/V) and at the end (each request that was not aborted against itself alone).
    Returns what it exercised."""
    rng = random.Random(seed)
    args = dict(max_model_len=64, max_num_seqs=6) | config
    llm = LLM(model, **args)
    forks = watch_forks(llm)
    layers = llm.model.config.num_hidden_layers
    longest = min(args["max_model_len"], llm.num_blocks * llm.config.block_size) - 8  # room for max_tokens
    prefixes = [[rng.randrange(97) for _ in range(longest)] for _ in range(3)]
    requests: dict[int, tuple[list[int], SamplingParams]] = {}
    aborted: set[int] = set()
    steps = faults = checked = 0
    while steps < steps_wanted:
        if (rng.random() < 0.3 or not llm.has_unfinished_requests()) and len(requests) < 250:
            prompt, params = random_request(rng, prefixes, longest, min(4, args["max_num_seqs"]))
            requests[llm.add_request(prompt, params)] = (prompt, params)
        if not llm.has_unfinished_requests():
            break
        if rng.random() < fault_rate:
            inject(llm, rng, layers)
            with pytest.raises((Boom, KeyboardInterrupt)):
                llm.step()
            faults += 1
            if rng.random() < 0.3:
                victims = llm.failed_request_ids or list(requests)
                gone = rng.choice(victims)
                llm.abort_request(gone)
                aborted.add(gone)
        else:
            llm.step()
        steps += 1
        check_pool(llm)
        if steps % 5 == 0:
            checked += check_cached_kv(llm)
    drain(llm)
    free = llm.kv_manager.pool.num_free_blocks if hasattr(llm.kv_manager, "pool") else None
    assert free in (None, llm.num_blocks)
    solo = LLM(model, **args)
    for rid, (prompt, params) in requests.items():
        if rid not in aborted:
            got = tokens_of(llm, rid)
            assert got == [o.token_ids for o in solo.generate([prompt], params, use_tqdm=False)[0].outputs], rid
    return dict(steps=steps, faults=faults, checked=checked, forks=forks.forks)


TIGHT = dict(enable_prefix_caching=True, max_num_batched_tokens=2048)


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [
        dict(num_kvcache_blocks=12, block_size=4),
        dict(num_kvcache_blocks=14, block_size=4, enable_prefix_caching=True, max_num_batched_tokens=9),
        dict(num_kvcache_blocks=10, block_size=3, preemption_mode="swap", swap_space=6 * 2 * 2 * 3 * 2 * 16 * 4),
        dict(num_kvcache_blocks=16, block_size=5, enable_prefix_caching=True, preemption_mode="swap"),
        dict(num_kvcache_blocks=24, block_size=4, kv_layout="contiguous", contiguous_reserve="oracle"),
        # the two tight prefix-caching pools where n > 1 used to fork a sample with no blocks
        dict(TIGHT, num_kvcache_blocks=12, block_size=4, max_num_seqs=3, attention_backend="reference"),
        dict(TIGHT, num_kvcache_blocks=7, block_size=16, max_num_seqs=8, attention_backend="torch"),
    ],
)
def test_random_faults_leave_no_trace(tiny_model_dir, config):
    """Random workloads, a fault in about one step in four; retry or abort after each."""
    seed = zlib.crc32(repr(sorted(config.items())).encode())  # the same draw in every process
    seen = episode(tiny_model_dir, config, seed)
    assert seen["steps"] == 600 and seen["faults"] > 100 and seen["checked"] > 500, seen


def random_config(rng: random.Random) -> dict:
    """A configuration drawn so that tight pools, prefix caching and both torch-side backends
    meet often: about half the draws are prefix caching on a pool of a few blocks."""
    block_size = rng.choice([3, 4, 4, 8, 16])
    tight = rng.random() < 0.6
    slots = rng.randint(40, 70) if tight else rng.randint(80, 200)
    config = dict(
        num_kvcache_blocks=max(3, slots // block_size),
        block_size=block_size,
        max_num_seqs=rng.randint(2, 8),
        max_num_batched_tokens=rng.choice([9, 17, 64, 2048, 2048]),
        enable_prefix_caching=rng.random() < 0.7,
        attention_backend=rng.choice(["reference", "torch"]),
    )
    config["max_model_len"] = min(64, config["num_kvcache_blocks"] * block_size)
    if rng.random() < 0.25:
        config |= dict(preemption_mode="swap", swap_space=4 * 2 * 2 * block_size * 2 * 16 * 4)
    return config


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_random_faults_on_random_configurations(tiny_model_dir, seed):
    """Seeds the configuration too: 24 episodes of 300 steps, a fault in about one step in
    three, n up to 4; every fork is checked as it happens, so a sample forked without its
    parent's blocks fails at once, not tokens later."""
    rng = random.Random(1000 + seed)
    config = random_config(rng)
    seen = episode(tiny_model_dir, config, rng.randrange(2**32), steps_wanted=300, fault_rate=0.33)
    assert seen["faults"] > 30, (config, seen)


def test_a_parent_that_stops_on_its_first_token_leaves_its_samples_their_blocks(tiny_model_dir):
    """n = 3 with sample 0 stopping on its first token: its blocks are freed in the same
    postprocess that forks its siblings, so they must fork before any token is applied (else a
    sibling runs with the prompt's tokens counted as computed and an empty block table)."""
    prompt = list(range(5, 21))  # 16 tokens: 4 blocks of 4
    args = dict(num_kvcache_blocks=12, block_size=4, max_num_seqs=3, enable_prefix_caching=True, max_model_len=64)

    def run(stop: list[int], seed: int) -> tuple[LLM, list[list[int]]]:
        llm = LLM(tiny_model_dir, **args)
        params = SamplingParams(temperature=1.0, seed=seed, n=3, max_tokens=6, stop_token_ids=stop)
        llm.add_request(prompt, params)
        while llm.has_unfinished_requests():
            llm.step()
            for q in llm.scheduler.running:
                assert q.block_table.num_tokens == q.num_computed_tokens, q
        return llm, [o.token_ids for o in llm._requests[0].output(None).outputs]

    for seed in range(100):  # a seed where only sample 0 starts with its first token
        _, free = run([], seed)
        first = free[0][0]
        if all(out[0] != first for out in free[1:]):
            break
    else:
        pytest.fail("no seed in 0..99 gives sample 0 a first token of its own")
    _, stopped = run([first], seed)
    assert stopped[0] == [first] or stopped[0] == []
    for alone, got in zip(free[1:], stopped[1:]):
        cut = alone.index(first) if first in alone else len(alone)
        assert got[: min(cut, len(got))] == alone[: min(cut, len(got))] and len(got) >= min(cut, 1)
