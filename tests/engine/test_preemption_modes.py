"""Swapping against recomputation, and Orca's three contiguous reservations: the same tokens,
different memory."""

from __future__ import annotations

import pytest
from faults import check_pool
from modelkit import random_prompts

from minipaged import LLM, SamplingParams
from minipaged.engine.contiguous_manager import reservation
from minipaged.viz.snapshot import step_snapshot

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=3, n=3, max_tokens=10, ignore_eos=True)


def tokens(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "n=3 seeded"])
def test_swap_gives_the_tokens_of_recompute_and_of_each_request_alone(tiny_model_dir, params):
    prompts = random_prompts(8, seed=5, min_len=4, max_len=30)
    common = dict(max_model_len=64, block_size=4, num_kvcache_blocks=24, max_num_seqs=8)
    recompute = LLM(tiny_model_dir, **common)
    swap = LLM(tiny_model_dir, preemption_mode="swap", **common)
    want = tokens(recompute.generate(prompts, params, use_tqdm=False))
    assert tokens(swap.generate(prompts, params, use_tqdm=False)) == want
    alone = LLM(tiny_model_dir, max_model_len=64)
    assert [tokens(alone.generate([p], params, use_tqdm=False))[0] for p in prompts] == want
    stats = swap.kv_stats()
    assert stats["num_preemptions"] > 0 and stats["swapped_out_blocks"] == stats["swapped_in_blocks"] > 0
    assert recompute.kv_stats()["swapped_out_blocks"] == 0
    # recomputation prefills the preempted tokens again; swapping brings them back instead
    assert stats["prefill_tokens_computed"] < recompute.kv_stats()["prefill_tokens_computed"]
    check_pool(swap)
    assert swap.kv_manager.host_pool.num_free_blocks == swap.kv_manager.host_pool.num_blocks


def test_full_swap_space_falls_back_to_recompute(tiny_model_dir):
    prompts = random_prompts(8, seed=6, min_len=8, max_len=30)
    common = dict(max_model_len=64, block_size=4, num_kvcache_blocks=20, max_num_seqs=8)
    per_block = 2 * 2 * 4 * 2 * 16 * 4  # K and V x layers x block_size x kv heads x head_dim x fp32
    tight = LLM(tiny_model_dir, preemption_mode="swap", swap_space=3 * per_block, **common)
    assert tight.kv_manager.host_pool.num_blocks == 3
    want = tokens(LLM(tiny_model_dir, **common).generate(prompts, GREEDY, use_tqdm=False))
    assert tokens(tight.generate(prompts, GREEDY, use_tqdm=False)) == want
    stats = tight.kv_stats()
    # some preemptions found no room on the host: the blocks swapped are fewer than those preempted
    assert stats["num_preemptions"] > 0 and stats["prefill_tokens_computed"] > sum(map(len, prompts))


def test_swapped_sequences_resume_before_waiting_ones(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=6, preemption_mode="swap")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a, b = (llm.add_request(p, params) for p in ([1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14]))
    swapped_at = None
    while llm.has_unfinished_requests():
        snap = step_snapshot(llm)
        if snap.swapped and swapped_at is None:
            swapped_at = snap.step
            c = llm.add_request([20, 21, 22], params)  # arrives while b is in host memory
        if swapped_at is not None and snap.scheduled:
            assert not (any(s["request_id"] == c for s in snap.scheduled) and snap.swapped), "c ran before b came back"
        check_pool(llm)
    assert swapped_at is not None
    assert all(o.finished for o in (llm.get_output(r) for r in (a, b, c)))


def test_reservation_policies():
    assert [reservation(n, 512, "max") for n in (1, 100, 512)] == [512, 512, 512]
    assert [reservation(n, 512, "pow2") for n in (1, 2, 3, 100, 128, 129, 500)] == [1, 2, 4, 128, 128, 256, 512]
    assert [reservation(n, 512, "oracle") for n in (1, 100, 512)] == [1, 100, 512]


def test_orca_baselines_keep_the_tokens_and_differ_in_memory(tiny_model_dir):
    prompts = random_prompts(12, seed=8, min_len=3, max_len=20)
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    common = dict(max_model_len=64, block_size=4, num_kvcache_blocks=40, max_num_seqs=12)
    paged = LLM(tiny_model_dir, **common)
    want = tokens(paged.generate(prompts, params, use_tqdm=False))
    peaks = {}
    for policy in ("max", "pow2", "oracle"):
        llm = LLM(tiny_model_dir, kv_layout="contiguous", contiguous_reserve=policy, **common)
        running = []
        ids = [llm.add_request(p, params) for p in prompts]
        while llm.has_unfinished_requests():
            llm.step()
            running.append(len(llm.scheduler.running))
        assert tokens([llm.get_output(i) for i in ids]) == want, policy
        peaks[policy] = max(running)
    # 160 slots: Max fits 160 // 64 = 2 sequences, Pow2 (32 slots each) 5, Oracle (12-29) more
    assert peaks["max"] == 2 and peaks["max"] < peaks["pow2"] < peaks["oracle"]
    with pytest.raises(ValueError, match="contiguous_reserve must be one of"):
        LLM(tiny_model_dir, kv_layout="contiguous", contiguous_reserve="exact", **common)
    with pytest.raises(ValueError, match="for kv_layout='contiguous' only"):
        LLM(tiny_model_dir, contiguous_reserve="oracle", **common)
    with pytest.raises(ValueError, match="swapping needs kv_layout='paged'"):
        LLM(tiny_model_dir, kv_layout="contiguous", preemption_mode="swap", **common)
