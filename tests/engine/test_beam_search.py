"""Beam search over shared blocks, against a naive beam search that recomputes every beam from
scratch with no cache (the same rule, vLLM's ``LLM.beam_search``)."""

from __future__ import annotations

import pytest
import torch
from faults import check_pool
from modelkit import make_hf_model, random_prompts

from minipaged import LLM, BeamSearchParams, SamplingParams
from minipaged.attention.cache_attention import RecomputeAttention
from minipaged.tiny.task import prompt_for


@torch.inference_mode()
def naive_beam_search(
    model, prompt: list[int], params: BeamSearchParams, eos: set[int]
) -> list[tuple[list[int], float]]:
    """(output tokens, cum_logprob) of the best beams, best first; every beam run from scratch."""
    w = params.beam_width

    def score(tokens: list[int], cum: float) -> float:
        return cum / ((len(tokens) - (tokens[-1] in eos)) ** params.length_penalty)

    beams, done = [(list(prompt), 0.0)], []
    for _ in range(params.max_tokens):
        if not beams:
            break
        grown = []
        for tokens, cum in beams:
            logits = model(
                torch.tensor(tokens), torch.arange(len(tokens)), RecomputeAttention(torch.tensor([0, len(tokens)]))
            )
            values, ids = torch.log_softmax(logits[-1].float(), -1).topk(2 * w)
            for t, v in zip(ids.tolist(), values.tolist()):
                (done if t in eos and not params.ignore_eos else grown).append((tokens + [t], cum + v))
        grown.sort(key=lambda b: score(*b), reverse=True)
        beams = grown[:w]
    best = sorted(done + beams, key=lambda b: score(*b), reverse=True)[:w]
    return [(tokens[len(prompt) :], cum) for tokens, cum in best]


def assert_same(got, want) -> None:
    assert [s.token_ids for s in got.sequences] == [t for t, _ in want]
    for s, (_, cum) in zip(got.sequences, want):
        assert s.cum_logprob == pytest.approx(cum, abs=1e-4)


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 6])
def test_beams_equal_the_naive_search_without_eos(tiny_model_dir, width):
    """Several prompts at once in a pool small enough that beam searches are preempted."""
    prompts = random_prompts(3, seed=width, min_len=3, max_len=12)
    params = BeamSearchParams(beam_width=width, max_tokens=7, ignore_eos=True)
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=5 * width, max_num_seqs=3 * width)
    got = llm.beam_search(prompts, params)
    for prompt, out in zip(prompts, got):
        assert_same(out, naive_beam_search(llm.model, prompt, params, set()))
    check_pool(llm)
    assert llm.kv_manager.pool.num_free_blocks == llm.num_blocks
    if width >= 2:
        assert llm.kv_stats()["num_preemptions"] > 0


@pytest.mark.parametrize("config", [dict(preemption_mode="swap"), dict(enable_prefix_caching=True), {}])
@pytest.mark.parametrize("width", [2, 4])
def test_beams_with_eos_equal_the_naive_search(width, config):
    """The embedded model ends a copy with an end-of-sequence token: beams finish early."""
    prompts = [prompt_for("beam me up", "pre "), prompt_for("kv", ""), prompt_for("abc abc", "x")]
    params = BeamSearchParams(beam_width=width, max_tokens=14, length_penalty=0.7)
    llm = LLM(block_size=4, num_kvcache_blocks=8 * width, max_num_seqs=2 * width, **config)
    got = llm.beam_search(prompts, params)
    eos = set(llm.model.config.eos_token_ids)
    for prompt, out in zip(prompts, got):
        ids = llm.tokenizer.encode(prompt)
        assert_same(out, naive_beam_search(llm.model, ids, params, eos))
    assert any(s.finish_reason == "stop" for out in got for s in out.sequences)
    best = got[0].sequences[0]
    assert best.text == "beam me up" and best.token_ids[-1] in eos  # text without the final EOS
    assert llm.kv_manager.pool.num_free_blocks == llm.num_blocks


def test_width_one_is_greedy_when_eos_is_ignored(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=32)
    prompts = random_prompts(4, seed=9, min_len=2, max_len=20)
    beams = llm.beam_search(prompts, BeamSearchParams(beam_width=1, max_tokens=9, ignore_eos=True))
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True), use_tqdm=False)
    assert [b.sequences[0].token_ids for b in beams] == [g.outputs[0].token_ids for g in greedy]


@pytest.fixture(scope="module")
def eos_model_dir(tmp_path_factory):
    """The tiny random Qwen3 with token 93, one it often predicts, as its end-of-sequence token."""
    folder = tmp_path_factory.mktemp("tiny-qwen3-eos")
    make_hf_model("qwen3", eos_token_id=93).save_pretrained(folder)
    return folder


def test_width_one_may_finish_on_an_early_eos_where_greedy_does_not(eos_model_dir):
    """vLLM's rule: an EOS among a beam's two candidates finishes a sequence at once, even when it
    is the second most likely token, and it wins if its score is the best at the end. So width 1
    is not greedy decoding when EOS is close: here the beam ends after 3 tokens and an EOS that
    greedy decoding passed over; greedy reaches EOS 4 tokens later."""
    llm = LLM(eos_model_dir, max_model_len=64)
    prompt = [9, 43, 53, 67, 40, 32, 51, 44, 43, 93]
    params = BeamSearchParams(beam_width=1, max_tokens=8)
    got = llm.beam_search([prompt], params)[0]
    assert_same(got, naive_beam_search(llm.model, prompt, params, {93}))
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert greedy.token_ids == [38, 52, 10, 27, 40, 2, 9, 93] and greedy.finish_reason == "stop"
    assert got.sequences[0].token_ids == [38, 52, 10, 93] and got.sequences[0].finish_reason == "stop"
    ignoring = llm.beam_search([prompt], BeamSearchParams(beam_width=1, max_tokens=8, ignore_eos=True))[0]
    assert (
        ignoring.sequences[0].token_ids
        == llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )


def test_beams_share_blocks_and_free_pruned_ones_at_once(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=40)
    params = BeamSearchParams(beam_width=4, max_tokens=6, ignore_eos=True)
    rid = llm._add_many([list(range(10, 23))], [params])[0]
    group = llm._requests[rid]
    saved = []
    while llm.has_unfinished_requests():
        llm.step()
        check_pool(llm)  # every block is held exactly by the live beams' tables
        saved.append(llm.kv_stats()["blocks_saved"])
        if not group.done:
            assert len(group.live) == 4 and llm.scheduler.running == sorted(group.live, key=llm.scheduler.running.index)
    assert max(saved) >= 3  # the 13-token prompt's 3 full blocks are held once for 4 beams
    assert llm.kv_stats()["cow_copies"] > 0 and llm.kv_manager.pool.num_free_blocks == 40


def test_beam_search_is_refused_where_it_cannot_run(tiny_model_dir):
    with pytest.raises(ValueError, match="needs kv_layout='paged'"):
        LLM(tiny_model_dir, kv_layout="contiguous", max_model_len=64, num_kvcache_blocks=16).beam_search(
            [[1, 2]], BeamSearchParams(beam_width=2)
        )
    llm = LLM(tiny_model_dir, max_model_len=64, max_num_seqs=3, block_size=4, num_kvcache_blocks=8)
    with pytest.raises(ValueError, match="beam_width=4 beams but max_num_seqs=3"):
        llm.beam_search([[1, 2]], BeamSearchParams(beam_width=4))
    with pytest.raises(ValueError, match="needs 9 blocks of 4 tokens but the whole pool has 8"):
        llm.beam_search([[1] * 10], BeamSearchParams(beam_width=3, max_tokens=3))
    with pytest.raises(ValueError, match="beam_width must be >= 1"):
        BeamSearchParams(beam_width=0)
    assert not llm.has_unfinished_requests()
