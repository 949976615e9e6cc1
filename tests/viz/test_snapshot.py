"""Step snapshots (minipaged.viz.snapshot): one engine step run and recorded for drawing."""

from __future__ import annotations

from minipaged import LLM, SamplingParams
from minipaged.viz import StepSnapshot
from minipaged.viz.snapshot import step_snapshot


def test_a_snapshot_records_what_the_step_scheduled_and_left(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=16)
    a = llm.add_request(list(range(1, 10)), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    b = llm.add_request(list(range(20, 25)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    first = step_snapshot(llm)
    assert isinstance(first, StepSnapshot) and first.step == llm.num_steps == 1
    assert [(s["request_id"], s["kind"], s["num_tokens"]) for s in first.scheduled] == [
        (a, "prefill", 9),
        (b, "prefill", 5),
    ]
    assert [len(t) for t in first.block_tables.values()] == [3, 2]  # ceil(9/4), ceil(5/4)
    assert sum(c > 0 for c in first.ref_cnt) == 5 and first.num_free_blocks == 11
    second = step_snapshot(llm)
    assert [s["kind"] for s in second.scheduled] == ["decode", "decode"]
    assert [o.request_id for o in second.finished] == [b]  # its 2nd token: done, blocks freed at once
    assert list(second.block_tables.values()) == [first.block_tables[first.running[0]]]  # 10 tokens fit in 3
    assert second.num_free_blocks == 13
    third = step_snapshot(llm)
    assert third.scheduled[0]["num_tokens"] == 1 and third.finished[0].outputs[0].finish_reason == "length"
    assert len(third.finished[0].outputs[0].token_ids) == 3
    assert third.step == 3 and not llm.has_unfinished_requests()
    assert llm.kv_manager.pool.num_free_blocks == llm.num_blocks


def test_a_snapshot_steps_as_step_does(tiny_model_dir):
    """The same requests on two engines: each snapshot's outputs are what ``step()`` returns."""
    engines = [LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=8) for _ in range(2)]
    for llm in engines:
        llm.add_request(list(range(1, 12)), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        llm.add_request([3, 4, 5], SamplingParams(temperature=1.0, seed=2, n=2, max_tokens=5, ignore_eos=True))
    looked, plain = engines
    steps = 0
    while plain.has_unfinished_requests():
        snap, outputs = step_snapshot(looked), plain.step()
        assert snap.outputs == outputs and snap.finished == [o for o in outputs if o.finished]
        assert len(snap.running) == plain.kv_stats()["num_running"]  # (sequence ids are global: they differ)
        steps += 1
    assert not looked.has_unfinished_requests() and looked.num_steps == plain.num_steps == steps


def test_a_contiguous_cache_has_no_pool_to_snapshot(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, kv_layout="contiguous", num_kvcache_blocks=8)
    llm.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    snap = step_snapshot(llm)
    assert (snap.ref_cnt, snap.cached, snap.num_free_blocks) == ([], [], 0)
    assert [len(o.outputs[0].token_ids) for o in snap.outputs] == [1] and len(snap.running) == 1
