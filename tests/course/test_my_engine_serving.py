"""The learner's engine serves: ``my_engine``'s pieces in the package's engine, real chats and the
classroom server, with the same tokens as the package's engine.

The reference solutions (``my_engine_solutions/``) stand in for a learner who wrote every stage;
the repository's own ``my_engine/`` is the copy as shipped (stubs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import uvicorn

from exercises.__main__ import main as exercises_main
from minipaged import LLM, SamplingParams
from minipaged.course.my_engine.serving import PIECES, compare, learner_engine
from minipaged.model.hub import DEFAULT_CHAT_MODEL
from minipaged.tiny import task
from tests.serve.harness import ServerThread

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = Path(__file__).resolve().parent / "my_engine_solutions"
SYSTEM = {"role": "system", "content": "You are a patient teacher of how language models are served. Be brief."}
QUESTIONS = ["What is a page table?", "Why cache keys and values?", "What is a block of memory?"]
TEXTS = ("paged memory", "blocks of sixteen", "a b c d e f", "kv cache")
COPY = [task.prompt_for(t) for t in TEXTS]


@pytest.mark.slow
def test_the_learners_engine_answers_real_chats_with_the_packages_tokens():
    """SmolLM2 in fp32, every piece the learner's; a pool of 6 blocks for 3 chats that share a
    system prompt: prefix hits, preemption, recompute and eviction all happen."""
    kw = dict(dtype="float32", enable_prefix_caching=True, num_kvcache_blocks=6, max_num_batched_tokens=64)
    mine = learner_engine(DEFAULT_CHAT_MODEL, root=SOLUTIONS, **kw)
    assert set(mine.pieces.yours) == set(PIECES) and not mine.pieces.package
    package = LLM(DEFAULT_CHAT_MODEL, **kw)
    result = compare(mine, package, [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS], max_tokens=16)
    assert result.first_difference is None, result
    assert all(len(t) == 16 for t in result.yours)
    stats = mine.kv_stats()
    assert stats["num_preemptions"] >= 1 and stats["prefix_hit_tokens"] > 0 and stats["prefix_evictions"] > 0
    calls = mine.pieces.calls
    ran = ["append_tokens", "store_kv", "paged_decode_attention", "paged_prefill_attention", "slot_mapping", "schedule"]
    ran += ["schedule: preempted", "block_hashes", "get_computed_blocks", "pool.allocate", "pool.touch"]
    assert [p for p in ran if calls[p] == 0] == []


def test_as_shipped_every_piece_is_the_packages_and_says_what_to_write():
    llm = learner_engine(None, root=ROOT, num_kvcache_blocks=32, max_model_len=256)
    assert not llm.pieces.yours and set(llm.pieces.package) == set(PIECES)
    report = llm.pieces.report()
    assert "the package's: not written yet (BlockPool: allocate, free, share: python -m exercises my_engine 1)" in (
        report
    )
    assert "python -m exercises my_engine 5" in report
    params = SamplingParams(temperature=0.0, max_tokens=24)
    got = [o.outputs[0].text for o in llm.generate(COPY, params, use_tqdm=False)]
    assert got == [task.expected_completion(t) for t in TEXTS]
    assert not llm.pieces.calls  # none of the learner's code ran


def _half_done(tmp_path: Path) -> Path:
    """Every stage written but the scheduler (stage 5 as shipped)."""
    shutil.copytree(SOLUTIONS / "my_engine", tmp_path / "my_engine")
    shutil.copy(ROOT / "my_engine" / "stage5_scheduler.py", tmp_path / "my_engine" / "stage5_scheduler.py")
    return tmp_path


def test_with_the_packages_scheduler_the_learners_fork_and_copy_on_write_serve_samples(tmp_path):
    llm = learner_engine(None, root=_half_done(tmp_path), num_kvcache_blocks=32, max_model_len=256)
    assert "scheduler" in llm.pieces.package and "fork, copy-on-write" in llm.pieces.yours
    [out] = llm.generate(COPY[:1], SamplingParams(n=2, temperature=0.0, max_tokens=24), use_tqdm=False)
    assert [o.text for o in out.outputs] == [task.expected_completion("paged memory")] * 2
    calls = llm.pieces.calls
    assert calls["pool.share"] > 0 and calls["pool.allocate"] > 0  # the fork shared, copy-on-write took a block


def test_the_learners_scheduler_refuses_n_above_1_before_queueing():
    llm = learner_engine(None, root=SOLUTIONS, num_kvcache_blocks=32, max_model_len=256)
    with pytest.raises(ValueError, match="one sequence per request"):
        llm.generate(COPY[:2], SamplingParams(n=2, max_tokens=4), use_tqdm=False)
    assert not llm.has_unfinished_requests()
    with pytest.raises(ValueError, match="paged"):
        learner_engine(None, root=SOLUTIONS, kv_layout="contiguous")


def test_exercises_serve_puts_the_learners_engine_behind_the_classroom_server(monkeypatch, capsys):
    served = {}
    monkeypatch.chdir(SOLUTIONS)  # the learner's folder, holding my_engine/
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **kw: served.update(app=app, host=host))
    exercises_main(["serve", "--copy-model", "--num-kvcache-blocks", "32", "--max-model-len", "256"])
    out = capsys.readouterr().out
    assert "scheduler            yours (stage 5)" in out and "minipaged serve: tiny-copy" in out
    assert served["host"] == "127.0.0.1"
    with ServerThread(served["app"]) as s:
        body = {"model": "tiny-copy", "prompt": COPY[:2], "max_tokens": 24, "temperature": 0}
        r = httpx.post(f"{s.url}/v1/completions", json=body, timeout=300)
        r.raise_for_status()
        texts = [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
        assert texts == [task.expected_completion(t) for t in TEXTS[:2]]
        assert s.llm.pieces.calls["schedule"] > 0 and s.llm.pieces.calls["paged_decode_attention"] > 0


def test_the_report_counts_the_pieces_that_are_yours(capsys):
    from exercises.__main__ import _my_engine_summary

    _my_engine_summary(SOLUTIONS)
    _my_engine_summary(ROOT)
    out = capsys.readouterr().out
    assert "Your engine: 10 of the engine's 10 pieces are yours" in out and "Your engine: 0 of the engine's 10" in out


def test_exercises_serve_without_my_engine_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert exercises_main(["serve", "--copy-model"]) == 2
    assert "python -m minipaged course OUT" in capsys.readouterr().out


@pytest.mark.parametrize("tells", ["on_evict", "nothing, hash cleared", "nothing, hash kept"])
def test_a_cached_block_the_learners_pool_hands_out_leaves_the_map(tells):
    """However the learner's pool treats a cached block it hands out again, the engine's map of
    cached blocks forgets it (else a later prompt would hit a block holding other tokens)."""
    from collections import Counter

    from minipaged.course import my_engine
    from minipaged.course.my_engine.seams import LearnerPool
    from minipaged.kv.prefix_cache import PrefixCache

    stage1 = my_engine.load(1, SOLUTIONS)

    class Pool(stage1.BlockPool):
        def allocate(self, n):
            blocks = [self.free_block_queue.popleft() for _ in range(n)]
            for block in blocks:
                if tells == "on_evict" and block.block_hash is not None:
                    self.on_evict(block)
                if tells != "nothing, hash kept":
                    block.block_hash = None
                block.ref_cnt = 1
            return blocks

    pool = LearnerPool(Pool(2), Counter())
    cache = PrefixCache(pool)
    [block] = pool.allocate(1)
    assert cache.insert(block, 1234, [1, 2, 3, 4]) and cache.blocks == {1234: block}
    pool.free([block])
    assert pool.allocate(2)[1] is block  # the cached block, handed out again for other tokens
    assert cache.blocks == {} and not cache.entries and cache.num_evictions == 1 and block.block_hash is None
