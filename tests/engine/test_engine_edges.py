"""The engine's hard edges, through the public API: bad input is refused before anything is
queued and leaves the engine unchanged; an interrupted ``generate`` leaves it usable."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from modelkit import random_prompts

from minipaged import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def tokens(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=40, max_num_seqs=4)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(n=2.0), TypeError, "n must be an int, got 2.0"),
        (dict(n=True), TypeError, "n must be an int, got True"),
        (dict(top_k=2.5), TypeError, "top_k must be an int"),
        (dict(top_k=-2), ValueError, "top_k must be >= -1"),
        (dict(seed=1.5), TypeError, "seed must be an int"),
        (dict(seed=2**64), ValueError, r"seed must be in \[0, 18446744073709551615\]"),
        (dict(seed=-1), ValueError, "seed must be in"),
        (dict(max_tokens=2.5), TypeError, "max_tokens must be an int"),
        (dict(temperature=math.nan), ValueError, "temperature must be a finite number"),
        (dict(temperature=math.inf), ValueError, "temperature must be a finite number"),
        (dict(temperature="0.5"), ValueError, "temperature must be a finite number"),
        (dict(top_p=math.nan), ValueError, "top_p must be a finite number"),
        (dict(ignore_eos=1), TypeError, "ignore_eos must be a bool"),
    ],
)
def test_sampling_params_refuse_bad_types_and_ranges(kwargs, error, message):
    with pytest.raises(error, match=message):
        SamplingParams(**kwargs)


def test_numpy_integers_are_ints():
    assert SamplingParams(n=np.int64(2), seed=np.uint64(2**64 - 1)).n == 2


@pytest.mark.slow
def test_vanishing_temperature_is_greedy_and_never_crashes(llm):
    prompts = random_prompts(3, seed=1, max_len=12)
    greedy = tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    tiny = SamplingParams(temperature=1e-30, max_tokens=6, ignore_eos=True, seed=3)
    assert tokens(llm.generate(prompts, tiny, use_tqdm=False)) == greedy


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_kvcache_blocks=0), ValueError, "num_kvcache_blocks must be >= 1, got 0"),
        (dict(num_kvcache_blocks=-3), ValueError, "num_kvcache_blocks must be >= 1, got -3"),
        (dict(max_model_len=0), ValueError, "max_model_len must be >= 1, got 0"),
        (dict(max_model_len=-5), ValueError, "max_model_len must be >= 1, got -5"),
        (dict(max_model_len=100_000), ValueError, "exceeds the model's max_position_embeddings 256"),
        (dict(block_size=16.0), TypeError, "block_size must be an int, got 16.0"),
        (dict(max_num_seqs=0), ValueError, "max_num_seqs must be >= 1"),
        (dict(max_num_batched_tokens=True), TypeError, "max_num_batched_tokens must be an int"),
        (dict(kv_layout="ring"), ValueError, "kv_layout must be one of"),
        (dict(attention_backend="flash"), ValueError, "attention_backend must be one of"),
        (dict(kv_layout="contiguous", enable_prefix_caching=True), ValueError, "prefix caching needs"),
        (dict(kv_cache_memory=1 << 20, num_kvcache_blocks=4), ValueError, "not both"),
        (dict(kv_cache_memory=1000, max_model_len=256), ValueError, "raise kv_cache_memory to at least"),
        (dict(blocks=4), TypeError, "unexpected keyword argument 'blocks'"),
    ],
)
def test_constructor_refuses_bad_arguments(tiny_model_dir, kwargs, error, message):
    with pytest.raises(error, match=message):
        LLM(tiny_model_dir, **kwargs)


def test_default_pool_comes_from_a_memory_budget(tiny_model_dir, caplog):
    """2 layers x 2 KV heads x head_dim 16 x 4 bytes x (K, V) = 512 bytes per token."""
    logging.getLogger("minipaged").addHandler(caplog.handler)
    try:
        capped = LLM(tiny_model_dir, max_model_len=256, max_num_seqs=4, block_size=16)
        budget = LLM(tiny_model_dir, max_model_len=256, block_size=16, kv_cache_memory=48 * 16 * 512)
    finally:
        logging.getLogger("minipaged").removeHandler(caplog.handler)
    assert capped.num_blocks == 4 * 16  # max_num_seqs x max_model_len: no more could be used at once
    assert budget.num_blocks == 48 and budget.kv_cache.nbytes() == 48 * 16 * 512
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "KV cache: 64 blocks x 16 tokens = 0.5 MiB (limited by max_num_seqs x max_model_len)",
        "KV cache: 48 blocks x 16 tokens = 0.4 MiB (limited by the 0.4 MiB budget)",
    ]


def test_pool_check_counts_only_stored_tokens(tiny_model_dir):
    """A 48-token prompt with max_tokens=1 stores 48 tokens: 3 blocks of 16 are enough."""
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=16, num_kvcache_blocks=3)
    out = llm.generate([[5] * 48], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 1
    with pytest.raises(ValueError, match="needs 4 blocks of 16 tokens but the whole pool has 3"):
        llm.generate([[5] * 48], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)


def test_n_above_max_num_seqs_is_refused_before_queuing(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, max_num_seqs=2)
    with pytest.raises(ValueError, match="n=3 samples but max_num_seqs=2"):
        llm.generate([[1, 2, 3], [4, 5]], [GREEDY, SamplingParams(n=3, max_tokens=4)], use_tqdm=False)
    assert not llm.has_unfinished_requests()


@pytest.mark.slow
def test_pending_forks_count_against_max_num_seqs(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, max_num_seqs=4)
    sp = SamplingParams(n=3, max_tokens=5, seed=1, ignore_eos=True)
    for p in ([1, 2, 3], [4, 5, 6]):
        llm.add_request(p, sp)
    most = 0
    while llm.has_unfinished_requests():
        llm.step()
        most = max(most, len(llm.scheduler.running))
    assert most == 3  # never the two requests' 6 samples at once


@pytest.mark.parametrize(
    "prompt",
    [np.array([1, 2, 3]), np.array([1, 2, 3], dtype=np.int32), (1, 2, 3), torch.tensor([1, 2, 3])],
    ids=["numpy-int64", "numpy-int32", "tuple", "torch"],
)
@pytest.mark.slow
def test_integer_arrays_and_tuples_are_prompts(llm, prompt):
    want = llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want
    assert llm.generate([prompt, prompt], GREEDY, use_tqdm=False)[1].outputs[0].token_ids == want


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([1, 256.7], r"token ids must be ints, got 256.7 at position 1"),
        ([1, True], r"token ids must be ints, got True at position 1"),
        (np.array([1.0, 2.0]), "must hold integer token ids, got float64"),
        (np.array([[1, 2], [3, 4]]), "must be 1-D token ids"),
    ],
)
def test_float_and_bool_token_ids_are_refused(llm, prompt, message):
    with pytest.raises((TypeError, ValueError), match=message):
        llm.generate([[1, 2, 3], prompt], GREEDY, use_tqdm=False)
    assert not llm.has_unfinished_requests()


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt without disturbing pytest."""


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.slow
def test_interrupted_generate_leaves_the_engine_usable(tiny_model_dir, monkeypatch, caching):
    prompts = random_prompts(5, seed=4, min_len=6, max_len=30)
    kw = dict(max_model_len=64, block_size=4, num_kvcache_blocks=30, enable_prefix_caching=caching)
    want = tokens(LLM(tiny_model_dir, **kw).generate(prompts, GREEDY, use_tqdm=False))
    llm = LLM(tiny_model_dir, **kw)
    forward, calls = llm.model.forward, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Interrupt
        return forward(*args, **kwargs)

    monkeypatch.setattr(llm.model, "forward", failing)
    with pytest.raises(Interrupt):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert not llm.has_unfinished_requests()
    pool = llm.kv_manager.pool
    pool.check_invariants()
    assert all(b.ref_cnt == 0 for b in pool.blocks)  # every block freed (cached ones may stay cached)
    # The next call works and, with caching on, never reads K/V that the failed step did not write.
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == want
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == want


def test_abort_request_frees_and_reports(llm):
    a = llm.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=20, ignore_eos=True))
    b = llm.add_request([6, 7, 8], GREEDY)
    llm.step()
    llm.abort_request(a)
    finished = {}
    while llm.has_unfinished_requests():
        finished.update({o.request_id: o for o in llm.step() if o.finished})
    assert list(finished) == [b]
    assert llm.get_output(a).outputs[0].finish_reason == "abort"
    assert llm.kv_manager.pool.num_free_blocks == llm.num_blocks
    llm.abort_request(a)  # already finished: nothing to do
    with pytest.raises(ValueError, match="no request with id 12345"):
        llm.abort_request(12345)


@pytest.mark.slow
def test_generation_stops_on_any_of_several_eos_ids(tmp_path):
    """Llama 3 style: config.json lists two stop ids, generation_config.json adds a third."""
    import json

    from modelkit import make_hf_model

    hf = make_hf_model("llama")
    hf.save_pretrained(tmp_path)
    prompt = [3, 1, 4, 1, 5]
    free = LLM(tmp_path, max_model_len=64).generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    first, second = free[0], free[1]
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["eos_token_id"] = [96, second]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sp = SamplingParams(temperature=0, max_tokens=6)
    out = LLM(tmp_path, max_model_len=64).generate([prompt], sp, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [first, second] and out.finish_reason == "stop"
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": first}))
    out = LLM(tmp_path, max_model_len=64).generate([prompt], sp, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [first] and out.finish_reason == "stop"
