"""The projector's frames from real engine snapshots, and the streamed-text rules (pure functions)."""

from __future__ import annotations

import json

import pytest

from minipaged import LLM, SamplingParams
from minipaged.serve import projector
from minipaged.serve.deltas import TextStream, sendable
from minipaged.tiny import task
from minipaged.viz.snapshot import step_snapshot


def run(llm: LLM) -> list:
    snaps = []
    while llm.has_unfinished_requests():
        snaps.append(step_snapshot(llm))
    return snaps


def test_copy_on_write_is_seen_by_comparing_snapshots():
    llm = LLM(num_kvcache_blocks=32)
    llm.add_request(task.prompt_for("fork me", "p" * 20), SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=12))
    snaps = run(llm)
    events = [projector.step_events(a, b, llm.block_size) for a, b in zip([None, *snaps], snaps)]
    cow = [pair for e in events for pair in e["cow"]]
    assert len(cow) == llm.kv_stats()["cow_copies"] == 2  # two of the three samples copy the shared tail
    old, new = cow[0]
    step = next(i for i, e in enumerate(events) if e["cow"])
    assert snaps[step - 1].ref_cnt[old] == 3 and snaps[step].ref_cnt[new] == 1


def test_prefix_hits_and_evictions_are_seen_by_comparing_snapshots():
    llm = LLM(num_kvcache_blocks=12, enable_prefix_caching=True)
    preamble = "a shared lesson prompt, long enough for blocks " * 2  # 94 chars: 5 full blocks + 14
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    snaps = []
    for text in ("one", "two", "z" * 150):  # the third needs the pool: it evicts cached blocks
        llm.add_request(task.prompt_for(text, preamble if len(text) < 5 else ""), params)
        snaps += run(llm)
    events = [projector.step_events(a, b, llm.block_size) for a, b in zip([None, *snaps], snaps)]
    hits = [b for e in events for b in e["hits"]]
    # the preamble's 5 full blocks; the 6th also holds "<copy>" and each text's first letter
    assert len(hits) * llm.block_size == llm.kv_stats()["prefix_hit_tokens"] == 80
    evicted = [b for e in events for b in e["evicted"]]
    assert len(evicted) == llm.kv_manager.prefix_cache.num_evictions > 0


def test_a_frame_shows_every_block_owner_and_queue():
    llm = LLM(num_kvcache_blocks=16, max_num_seqs=2)
    ids = [llm.add_request(task.prompt_for(t, "x" * 30), SamplingParams(temperature=0, max_tokens=8)) for t in "abc"]
    snap = step_snapshot(llm)
    pool = llm.pool_summary()
    seqs = {s.seq_id: (s.request_id, s.sample_index) for s in [*pool.running, *pool.waiting]}
    labels = {ids[0]: "ana"}
    frame = projector.frame(snap, seqs, labels, projector.no_events(), {"x": 1}, llm.num_blocks, llm.block_size)
    json.dumps(frame)  # JSON-ready
    assert len(frame["blocks"]) == 16
    used = [b for b, (ref, _, owners) in enumerate(frame["blocks"]) if ref]
    assert sorted(used) == sorted(b for t in snap.block_tables.values() for b in t)
    assert [r["id"] for r in frame["running"]] == ids[:2] and [w["id"] for w in frame["waiting"]] == ids[2:]
    assert frame["running"][0]["label"] == "ana" and frame["running"][1]["label"] == f"R{ids[1]}"
    assert frame["running"][0]["samples"][0]["blocks"] == snap.block_tables[snap.running[0]]
    assert len({tuple(v) for v in frame["inks"].values()}) == 3  # requests alive together: three inks
    assert frame["figures"] == {"x": 1}


@pytest.mark.parametrize(
    "text,stop,finished,want",
    [
        ("hello", (), False, 5),
        ("hel\ufffd", (), False, 3),  # half a character: wait for its other bytes
        ("hel\ufffd", (), True, 4),  # finished: send what there is
        ("say st", ("stop",), False, 4),  # "st" may start "stop"
        ("say s", ("stop", "xs"), False, 4),
        ("say x", ("stop",), False, 5),
    ],
)
def test_what_a_stream_may_send(text, stop, finished, want):
    assert sendable(text, stop, finished) == want


def test_the_streamed_pieces_add_up_to_the_final_text():
    stream = TextStream(stop=("ab",))
    texts = ["x", "xa", "xa\ufffd", "xa\u00e9c", "xa\u00e9cd"]
    pieces = [stream.delta(t, finished=False) for t in texts] + [stream.delta("xa\u00e9cde", finished=True)]
    assert pieces == ["x", "", "", "a\u00e9c", "d", "e"]
    assert "".join(pieces) == "xa\u00e9cde"
