"""Log-probabilities (``SamplingParams(logprobs=k, prompt_logprobs=k)``), checked against a forward
of the whole sequence without a cache, and unchanged by batching, prefix caching, chunked
prefill, preemption and a failed step."""

from __future__ import annotations

import math

import pytest
import torch
from faults import Boom, fail_in_sampling
from modelkit import random_prompts

from minipaged import LLM, SamplingParams
from minipaged.attention.cache_attention import RecomputeAttention
from minipaged.engine.logprobs import Logprob, score
from minipaged.engine.sampling_params import MAX_LOGPROBS

TOL = 1e-4
SAMPLED = SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=6, ignore_eos=True, logprobs=3)
SCORED = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=3)


@pytest.fixture(scope="module")
def prompts():
    """Four prompts of 5 to 24 tokens; the third starts with the first's first 8 (a prefix hit to skip)."""
    p = random_prompts(4, seed=11, min_len=5, max_len=24)
    return [p[0], p[1], p[0][:8] + p[2], p[3]]


def reference(llm: LLM, token_ids: list[int]) -> torch.Tensor:
    """log_softmax of the logits at every position of ``token_ids``, computed without a cache: [len, vocab]."""
    n = len(token_ids)
    with torch.inference_mode():
        logits = llm.model(torch.tensor(token_ids), torch.arange(n), RecomputeAttention(torch.tensor([0, n])))
    return torch.log_softmax(logits.float(), dim=-1)


def check_entry(entry: dict[int, Logprob], token: int, ref: torch.Tensor, k: int) -> None:
    """``entry`` scores ``token`` by ``ref`` ([vocab] log-probabilities): the token first, then the top k."""
    assert list(entry)[0] == token and len(entry) in (k, k + 1)
    for t, lp in entry.items():
        assert math.isclose(lp.logprob, ref[t].item(), abs_tol=TOL)
        # 1 + the tokens strictly above (a near-tie may go either way)
        assert int((ref > ref[t] + TOL).sum()) + 1 <= lp.rank <= int((ref > ref[t] - TOL).sum()) + 1
    top = sorted((lp.logprob for t, lp in list(entry.items())[1:]), reverse=True)
    if entry[token].rank <= k:  # the scored token is one of the top k: it is listed once, first
        top = sorted([entry[token].logprob, *top], reverse=True)
    torch.testing.assert_close(torch.tensor(top), ref.topk(k).values, atol=TOL, rtol=0)


def entries_close(a: list, b: list) -> None:
    """Two lists of entries (``None`` or ``{token: Logprob}``) hold the same tokens, ranks and logprobs."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if x is None or y is None:
            assert x is y
            continue
        assert list(x) == list(y) and [lp.rank for lp in x.values()] == [lp.rank for lp in y.values()]
        for lx, ly in zip(x.values(), y.values()):
            assert math.isclose(lx.logprob, ly.logprob, abs_tol=TOL)


def test_sampled_tokens_are_scored_by_the_raw_distribution(tiny_model_dir, prompts):
    llm = LLM(tiny_model_dir, max_model_len=64)
    for prompt, out in zip(prompts, llm.generate(prompts, SAMPLED, use_tqdm=False)):
        c = out.outputs[0]
        ref = reference(llm, prompt + c.token_ids)  # raw: no temperature, no top-k
        assert len(c.logprobs) == len(c.token_ids) == SAMPLED.max_tokens
        for i, (token, entry) in enumerate(zip(c.token_ids, c.logprobs)):
            check_entry(entry, token, ref[len(prompt) - 1 + i], SAMPLED.logprobs)
        assert math.isclose(c.cumulative_logprob, sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)))
        assert out.prompt_logprobs is None  # not asked for


def test_greedy_tokens_have_rank_1_and_logprobs_0_lists_the_token_alone(tiny_model_dir, prompts):
    llm = LLM(tiny_model_dir, max_model_len=64)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=0)
    for out in llm.generate(prompts, params, use_tqdm=False):
        c = out.outputs[0]
        assert [list(e) for e in c.logprobs] == [[t] for t in c.token_ids]
        assert all(e[t].rank == 1 for t, e in zip(c.token_ids, c.logprobs))


def test_without_logprobs_outputs_carry_none(tiny_model_dir, prompts):
    out = LLM(tiny_model_dir, max_model_len=64).generate(prompts[0], SamplingParams(max_tokens=2), use_tqdm=False)[0]
    assert out.outputs[0].logprobs is None and out.outputs[0].cumulative_logprob is None
    assert out.prompt_logprobs is None


def test_prompt_logprobs_score_each_prompt_token_given_those_before(tiny_model_dir, prompts):
    llm = LLM(tiny_model_dir, max_model_len=64)
    for prompt, out in zip(prompts, llm.generate(prompts, SCORED, use_tqdm=False)):
        ref = reference(llm, prompt)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for j in range(1, len(prompt)):
            check_entry(out.prompt_logprobs[j], prompt[j], ref[j - 1], SCORED.prompt_logprobs)


@pytest.fixture(scope="module")
def alone(tiny_model_dir, prompts):
    """Each prompt scored on its own, in an ample pool: (prompt entries, [output entries per sample])."""
    llm = LLM(tiny_model_dir, max_model_len=64)
    outs = [llm.generate([p], SCORED, use_tqdm=False)[0] for p in prompts]
    return [(o.prompt_logprobs, [c.logprobs for c in o.outputs]) for o in outs]


def assert_as_alone(outs, alone) -> None:
    for out, (prompt_entries, sample_entries) in zip(outs, alone, strict=True):
        entries_close(out.prompt_logprobs, prompt_entries)
        for c, entries in zip(out.outputs, sample_entries, strict=True):
            entries_close(c.logprobs, entries)


@pytest.mark.parametrize(
    "engine",
    [
        dict(),  # batched
        dict(max_num_batched_tokens=5),  # every prompt prefilled in chunks of at most 5 tokens
        dict(block_size=4, num_kvcache_blocks=12),  # preempted and recomputed
        dict(block_size=4, num_kvcache_blocks=12, preemption_mode="swap"),  # preempted to host memory
        dict(block_size=4, max_num_batched_tokens=6, num_kvcache_blocks=14, enable_prefix_caching=True),
    ],
)
def test_batched_chunked_and_preempted_equal_alone(tiny_model_dir, prompts, alone, engine):
    llm = LLM(tiny_model_dir, max_model_len=64, **engine)
    assert_as_alone(llm.generate(prompts, SCORED, use_tqdm=False), alone)
    if "num_kvcache_blocks" in engine and "max_num_batched_tokens" not in engine:
        assert llm.kv_stats()["num_preemptions"] > 0  # the case is what it says


def test_prompt_logprobs_skip_the_prefix_cache(tiny_model_dir, prompts, alone):
    """The rule (vLLM's): a request asking for prompt logprobs reads no cached block, so every
    prompt token is scored; its own blocks are cached for the requests after it."""
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=4, enable_prefix_caching=True)
    prompt = prompts[0]
    warm = llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert warm.num_cached_tokens == 0
    scored = llm.generate([prompt], SCORED, use_tqdm=False)[0]
    assert scored.num_cached_tokens == 0  # a hit was there to take, and was not taken
    assert_as_alone([scored], alone[:1])
    assert llm.reset_prefix_cache()
    llm.generate([prompt], SCORED, use_tqdm=False)
    after = llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert after.num_cached_tokens == (len(prompt) - 1) // 4 * 4  # the scored request's blocks


def test_samples_share_one_prompt_scoring(tiny_model_dir, prompts):
    llm = LLM(tiny_model_dir, max_model_len=64)
    params = SamplingParams(n=3, seed=2, max_tokens=4, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    out = llm.generate(prompts[1], params, use_tqdm=False)[0]
    assert len(out.prompt_logprobs) == len(prompts[1])
    for c in out.outputs:
        ref = reference(llm, prompts[1] + c.token_ids)
        for i, (token, entry) in enumerate(zip(c.token_ids, c.logprobs)):
            check_entry(entry, token, ref[len(prompts[1]) - 1 + i], 1)


def test_a_failed_step_scores_nothing_twice(tiny_model_dir, prompts, alone):
    llm = LLM(tiny_model_dir, max_model_len=64, max_num_batched_tokens=5)
    rid = llm.add_request(prompts[1], SCORED)  # 24 tokens
    llm.step()  # the first chunk: prompt tokens 1..5 scored
    fail_in_sampling(llm, after_draw=True)
    with pytest.raises(Boom):
        llm.step()  # would have scored tokens 6..10: recomputed from token 0, they are scored once
    while llm.has_unfinished_requests():
        llm.step()
    assert_as_alone([llm.get_output(rid)], alone[1:2])


def test_token_text_is_decoded_once_each_token_alone():
    llm = LLM(max_model_len=64)
    prompt = "abc<copy>hi<end>"
    params = SamplingParams(temperature=0, max_tokens=3, logprobs=2, prompt_logprobs=1)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    tok = llm.tokenizer
    for entry in [*out.prompt_logprobs[1:], *out.outputs[0].logprobs]:
        assert all(lp.decoded_token == tok.decode([t], skip_special_tokens=False) for t, lp in entry.items())
    assert out.prompt_logprobs[3][tok.encode("<copy>")[0]].decoded_token == "<copy>"  # special tokens by name
    assert out.outputs[0].text == "hi"


def test_score_ranks_ties_alike_and_lists_the_scored_token_first():
    logits = torch.tensor([[2.0, 5.0, 5.0, 1.0, 0.0]])
    (entry,) = score(logits, [3], [2])
    assert list(entry) == [3, 1, 2]
    assert [lp.rank for lp in entry.values()] == [4, 1, 1]  # 1 + tokens strictly above
    (entry,) = score(logits, [2], [3])
    assert list(entry) == [2, 1, 0]  # in the top 3 already: listed once


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(logprobs=-1), ValueError, "logprobs must be >= 0"),
        (dict(prompt_logprobs=MAX_LOGPROBS + 1), ValueError, "prompt_logprobs must be <= MAX_LOGPROBS = 20"),
        (dict(logprobs=2.0), TypeError, "logprobs must be an int"),
        (dict(prompt_logprobs=True), TypeError, "prompt_logprobs must be an int"),
        (dict(logprobs="3"), TypeError, "logprobs must be an int"),
    ],
)
def test_bad_counts_are_refused_before_anything_is_queued(kwargs, error, message):
    with pytest.raises(error, match=message):
        SamplingParams(**kwargs)


def test_counts_up_to_the_cap_are_accepted():
    assert SamplingParams(logprobs=MAX_LOGPROBS, prompt_logprobs=0).logprobs == MAX_LOGPROBS
