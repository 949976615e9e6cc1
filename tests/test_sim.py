"""Synthetic traces and the contiguous-versus-paged memory replay."""

from __future__ import annotations

import statistics
import time

import pytest

from minipaged.sim import Request, simulate_contiguous_vs_paged, synthetic_trace, token_ids_for


def test_trace_is_determined_by_its_seed():
    assert synthetic_trace(50, seed=3) == synthetic_trace(50, seed=3)
    assert synthetic_trace(50, seed=3) != synthetic_trace(50, seed=4)


def test_trace_lengths_are_long_tailed_and_bounded():
    trace = synthetic_trace(2000, seed=0, mean_prompt=200, mean_output=100, max_len=1024, arrival_rate=0.5)
    prompts = [r.prompt_len for r in trace]
    assert all(r.prompt_len >= 1 and r.output_len >= 1 and r.total_len <= 1024 for r in trace)
    assert statistics.median(prompts) < 0.8 * statistics.mean(prompts)  # a long right tail
    assert max(prompts) > 4 * statistics.median(prompts)
    assert 170 < statistics.mean(prompts) < 230  # the clipped lognormal keeps roughly its mean
    arrivals = [r.arrival for r in trace]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0
    assert 3600 < arrivals[-1] < 4400  # 2000 arrivals at 0.5 per step take ~4000 steps
    assert [r.request_id for r in trace] == list(range(2000))


def test_shared_prefixes_and_token_ids():
    trace = synthetic_trace(30, seed=1, mean_prompt=20, shared_prefix_len=32, num_prefixes=3)
    assert {r.prefix_id for r in trace} == {0, 1, 2}
    assert all(r.prefix_len == 32 and r.prompt_len > 32 for r in trace)
    ids = {r.request_id: token_ids_for(r, vocab_size=50, seed=7) for r in trace}
    assert all(len(ids[r.request_id]) == r.prompt_len for r in trace)
    assert all(0 <= t < 50 for toks in ids.values() for t in toks)
    by_prefix: dict[int, list[list[int]]] = {}
    for r in trace:
        by_prefix.setdefault(r.prefix_id, []).append(ids[r.request_id])
    heads = {p: {tuple(toks[:32]) for toks in group} for p, group in by_prefix.items()}
    assert all(len(h) == 1 for h in heads.values())  # one prefix per prefix_id
    assert len(set.union(*heads.values())) == 3  # and different prefix_ids differ
    tails = [tuple(toks[32:]) for toks in ids.values()]
    assert len(set(tails)) == len(tails)  # the rest of each prompt is its own
    assert token_ids_for(trace[0], 50, seed=7) == ids[0]
    assert token_ids_for(trace[0], 50, seed=8) != ids[0]


def test_no_prefix_means_independent_prompts():
    a, b = Request(0, 0, 10, 5), Request(1, 0, 10, 5)
    assert token_ids_for(a, 1000, seed=0) != token_ids_for(b, 1000, seed=0)


def test_prefix_arguments_must_agree():
    with pytest.raises(ValueError, match="both be 0 or both be positive"):
        synthetic_trace(5, seed=0, shared_prefix_len=16)
    with pytest.raises(ValueError, match="leaves no room"):
        synthetic_trace(5, seed=0, shared_prefix_len=64, num_prefixes=1, max_len=64)


def test_replay_by_hand():
    """64 slots, max_seq_len 32: contiguous fits 2 buffers, paged (8 blocks of 8) fits all 3 requests."""
    trace = [Request(i, 0, prompt_len=4, output_len=2) for i in range(3)]
    res = simulate_contiguous_vs_paged(trace, num_slots=64, block_size=8, max_seq_len=32)
    c, p = res["contiguous"], res["paged"]
    # Admitted at step 0 with 4 tokens, 5 and 6 tokens at steps 1 and 2, released at step 3.
    assert res["time"] == list(range(7))
    assert p["running"] == [3, 3, 3, 0, 0, 0, 0]
    assert p["used_slots"] == [12, 15, 18, 0, 0, 0, 0]
    assert p["allocated_slots"] == [24, 24, 24, 0, 0, 0, 0]
    # The third request waits for a whole 32-slot buffer to come free.
    assert c["running"] == [2, 2, 2, 1, 1, 1, 0]
    assert c["queue_len"] == [1, 1, 1, 0, 0, 0, 0]
    assert c["admitted"] == [2, 2, 2, 3, 3, 3, 3]
    assert c["used_slots"] == [8, 10, 12, 4, 5, 6, 0]
    assert c["allocated_slots"] == [64, 64, 64, 32, 32, 32, 0]
    assert c["external_fragmentation"][3] == 0.0  # one hole of 32
    assert res["totals"]["contiguous"]["steps"] == 6 and res["totals"]["paged"]["steps"] == 3
    exact = simulate_contiguous_vs_paged(trace, num_slots=64, block_size=8, max_seq_len=32, reserve="exact")
    assert exact["contiguous"]["allocated_slots"][:4] == [18, 18, 18, 0]


@pytest.fixture(scope="module")
def realistic():
    trace = synthetic_trace(200, seed=0, mean_prompt=256, mean_output=128, max_len=2048, arrival_rate=0.5)
    start = time.perf_counter()
    result = simulate_contiguous_vs_paged(trace, num_slots=16384, block_size=16, max_seq_len=2048)
    return trace, result, time.perf_counter() - start


def test_paged_admits_more_with_the_same_memory(realistic):
    _, res, seconds = realistic
    c, p = res["totals"]["contiguous"], res["totals"]["paged"]
    assert p["peak_running"] > 3 * c["peak_running"]  # 8 buffers of 2048 vs blocks on demand
    assert p["mean_running"] > 2 * c["mean_running"]
    assert p["steps"] < 0.5 * c["steps"]
    assert c["token_utilization"] < 0.4  # the paper's 20.4-38.2% for prior systems
    assert p["token_utilization"] > 0.9  # only last blocks are partly empty
    assert seconds < 3.0  # ~0.2 s here; notebooks replay it interactively


def test_replay_leaks_nothing_and_stays_in_bounds(realistic):
    trace, res, _ = realistic
    for name in ("contiguous", "paged"):
        series, totals = res[name], res["totals"][name]
        assert all(len(values) == len(res["time"]) for values in series.values())
        assert totals["finished"] == len(trace) and totals["final_allocated_slots"] == 0
        assert series["admitted"][-1] == len(trace) and series["queue_len"][-1] == 0
        for used, allocated in zip(series["used_slots"], series["allocated_slots"], strict=True):
            assert 0 <= used <= allocated <= 16384
        assert all(0.0 <= f < 1.0 for f in series["external_fragmentation"])
    assert res["totals"]["contiguous"]["preemptions"] == 0


def test_replay_is_deterministic_and_validates(realistic):
    trace, res, _ = realistic
    again = simulate_contiguous_vs_paged(trace, num_slots=16384, block_size=16, max_seq_len=2048)
    assert again == res
    with pytest.raises(ValueError, match="exceed max_seq_len 1024"):
        simulate_contiguous_vs_paged(trace, num_slots=16384, block_size=16, max_seq_len=1024)
    with pytest.raises(ValueError, match="reserve must be"):
        simulate_contiguous_vs_paged(trace, num_slots=16384, block_size=16, max_seq_len=2048, reserve="min")
