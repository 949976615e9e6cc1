"""Stage 5: the engine — continuous batching, chunked prefill, preemption, sampling, bad input."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from modelkit import random_prompts

from minipaged import LLM, SamplingParams
from minipaged.engine.kv_manager import PagedKVManager
from minipaged.utils import cdiv
from minipaged.viz.snapshot import step_snapshot

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def tokens(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


def assert_pool_clean(llm: LLM) -> None:
    assert not llm.has_unfinished_requests()
    if isinstance(llm.kv_manager, PagedKVManager):
        llm.kv_manager.pool.check_invariants()
        assert llm.kv_manager.pool.num_free_blocks == llm.num_blocks
    else:
        assert llm.kv_manager.arena.reservations() == {}


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(10, seed=3, max_len=40)


@pytest.fixture(scope="module")
def alone(tiny_model_dir, prompts):
    """Each prompt generated on its own, with an ample pool."""
    llm = LLM(tiny_model_dir, max_model_len=128)
    return [tokens(llm.generate([p], GREEDY, use_tqdm=False))[0] for p in prompts]


@pytest.mark.slow
def test_batched_equals_alone(tiny_model_dir, prompts, alone):
    llm = LLM(tiny_model_dir, max_model_len=128)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    assert_pool_clean(llm)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_kvcache_blocks=8, block_size=8),  # far smaller than the batch needs: preemptions
        dict(max_num_batched_tokens=7),  # chunked prefill of every prompt longer than 7
        dict(max_num_seqs=3, block_size=4),
        dict(kv_layout="contiguous", num_kvcache_blocks=32, block_size=8),  # room for 2 reservations
        dict(num_kvcache_blocks=9, block_size=8, max_num_batched_tokens=5, enable_prefix_caching=True),
    ],
)
@pytest.mark.slow
def test_same_tokens_under_any_configuration(tiny_model_dir, prompts, alone, kwargs):
    llm = LLM(tiny_model_dir, max_model_len=128, **kwargs)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    assert_pool_clean(llm)


@pytest.mark.slow
def test_memory_pressure_preempts_and_recovers(tiny_model_dir, prompts, alone):
    llm = LLM(tiny_model_dir, max_model_len=128, num_kvcache_blocks=7, block_size=8)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone
    assert llm.kv_stats()["num_preemptions"] >= 4
    assert_pool_clean(llm)


def test_step_returns_the_outputs_of_the_requests_it_advanced(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=64, block_size=4, num_kvcache_blocks=16)
    a = llm.add_request(list(range(1, 10)), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    b = llm.add_request(list(range(20, 25)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert llm.num_steps == 0
    first = llm.step()
    assert [(o.request_id, len(o.outputs[0].token_ids), o.finished) for o in first] == [(a, 1, False), (b, 1, False)]
    second = llm.step()
    assert [(o.request_id, o.finished) for o in second] == [(a, False), (b, True)]  # b's 2nd token: done
    assert second[1].outputs[0].finish_reason == "length" and second[1] == llm.get_output(b)
    third = llm.step()
    assert [o.request_id for o in third] == [a] and third[0] == llm.get_output(a)
    assert len(third[0].outputs[0].token_ids) == 3 and third[0].finished
    assert llm.num_steps == 3
    assert_pool_clean(llm)


@pytest.mark.slow
def test_seeded_sampling_does_not_depend_on_batching_or_preemption(tiny_model_dir, prompts):
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_tokens=10, seed=i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    ample = LLM(tiny_model_dir, max_model_len=128)
    alone = [tokens(ample.generate([p], sp, use_tqdm=False))[0] for p, sp in zip(prompts, params)]
    tight = LLM(tiny_model_dir, max_model_len=128, num_kvcache_blocks=8, block_size=8)
    assert tokens(tight.generate(prompts, params, use_tqdm=False)) == alone
    assert tight.kv_stats()["num_preemptions"] > 0
    greedy_like = {tuple(t[0]) for t in alone}
    assert len(greedy_like) == len(prompts)


@pytest.mark.slow
def test_parallel_sampling_copy_on_write_equals_independent_samples(tiny_model_dir):
    """n samples that share the prompt's blocks (paged, copy-on-write) produce the same tokens
    as n independent sequences (contiguous, nothing shared)."""
    prompts = random_prompts(3, seed=5, min_len=5, max_len=30)
    sp = SamplingParams(temperature=1.0, n=3, seed=7, max_tokens=8, ignore_eos=True)
    paged = LLM(tiny_model_dir, max_model_len=64, block_size=8)
    shared = tokens(paged.generate(prompts, sp, use_tqdm=False))
    contiguous = LLM(tiny_model_dir, max_model_len=64, kv_layout="contiguous", num_kvcache_blocks=72, block_size=8)
    assert shared == tokens(contiguous.generate(prompts, sp, use_tqdm=False))
    assert all(len(samples) == 3 and len({tuple(s) for s in samples}) > 1 for samples in shared)
    partial = sum(len(p) % 8 != 0 for p in prompts)
    assert paged.kv_stats()["cow_copies"] == 2 * partial  # all but the last writer copy the shared tail
    assert_pool_clean(paged)


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ([], GREEDY, "prompt 1 is empty"),
        ([1] * 30, SamplingParams(max_tokens=10), "exceeds max_model_len 32"),
        ([5, 97], GREEDY, r"outside the vocabulary \[0, 97\): \[97\]"),
        ([5, -1], GREEDY, "outside the vocabulary"),
        ("text", GREEDY, "no tokenizer"),
    ],
)
def test_bad_input_raises_and_loses_nothing(tiny_model_dir, prompt, params, message):
    llm = LLM(tiny_model_dir, max_model_len=32)
    with pytest.raises(ValueError, match=message):
        llm.generate([[1, 2, 3], prompt], [GREEDY, params], use_tqdm=False)
    assert not llm.has_unfinished_requests()  # nothing half-queued
    ok = llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert len(ok[0].outputs[0].token_ids) == 12


def test_request_that_never_fits_is_rejected_not_looped(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=128, num_kvcache_blocks=4, block_size=8)
    with pytest.raises(ValueError, match="needs 5 blocks of 8 tokens but the whole pool has 4"):
        llm.generate([[1] * 30], SamplingParams(max_tokens=10), use_tqdm=False)
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        LLM(tiny_model_dir, max_model_len=128, kv_layout="contiguous", num_kvcache_blocks=4, block_size=8)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=0), "max_tokens must be >= 1"),
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(n=0), "n must be >= 1"),
    ],
)
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_add_request_error_keeps_queued_requests(tiny_model_dir):
    llm = LLM(tiny_model_dir, max_model_len=32)
    rid = llm.add_request([1, 2, 3], GREEDY)
    with pytest.raises(ValueError):
        llm.add_request([], GREEDY)
    finished = []
    while llm.has_unfinished_requests():
        finished += [o for o in llm.step() if o.finished]
    assert [o.request_id for o in finished] == [rid]


@pytest.mark.slow
def test_reference_and_batched_backends_give_the_same_tokens(tiny_model_dir, prompts, alone):
    for backend in ("reference", "torch"):
        llm = LLM(tiny_model_dir, max_model_len=128, block_size=8, max_num_batched_tokens=20, attention_backend=backend)
        assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == alone


@pytest.mark.slow
def test_triton_backend_gives_the_same_tokens(tiny_model_dir):
    """The engine on the Triton kernels (interpreter on CPU) equals the torch reference, with a
    mixed batch: chunked prefill, decode, preemption and prefix hits all go through the kernels."""
    prompts = random_prompts(4, seed=8, min_len=3, max_len=20)
    kw = dict(
        max_model_len=48, block_size=4, num_kvcache_blocks=12, max_num_batched_tokens=16, enable_prefix_caching=True
    )
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    torch_out = LLM(tiny_model_dir, attention_backend="torch", **kw).generate(prompts + prompts[:1], sp, use_tqdm=False)
    triton = LLM(tiny_model_dir, attention_backend="triton", **kw)
    assert tokens(triton.generate(prompts + prompts[:1], sp, use_tqdm=False)) == tokens(torch_out)
    assert triton.kv_stats()["prefix_hit_tokens"] > 0


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    num_blocks=st.integers(4, 30),
    block_size=st.sampled_from([2, 4, 8]),
    budget=st.sampled_from([3, 16, 2048]),
    max_num_seqs=st.integers(1, 6),
)
@pytest.mark.slow
def test_random_mixes_never_lose_leak_or_double_hand_a_block(
    tiny_model_dir, seed, num_blocks, block_size, budget, max_num_seqs
):
    """Any request mix, any pool: every request finishes with its ample-pool tokens, no block is held
    by two live sequences (no sharing without prefix caching or n > 1), none leaks."""
    import random

    rng = random.Random(seed)
    prompts = random_prompts(rng.randint(1, 7), seed, min_len=1, max_len=20)
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(1, 6), ignore_eos=True) for _ in prompts]
    num_blocks = max(num_blocks, max(cdiv(len(p) + sp.max_tokens, block_size) for p, sp in zip(prompts, params)))
    llm = LLM(
        tiny_model_dir,
        max_model_len=32,
        block_size=block_size,
        num_kvcache_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
    )
    rids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while llm.has_unfinished_requests():
        snap = step_snapshot(llm)
        done.update({o.request_id: o.outputs[0].token_ids for o in snap.finished})
        held = [b for table in snap.block_tables.values() for b in table]
        assert len(held) == len(set(held)) == llm.kv_manager.pool.num_used_blocks
        assert all(snap.ref_cnt[b] == 1 for b in held)
    assert sorted(done) == rids
    assert_pool_clean(llm)
    ample = LLM(tiny_model_dir, max_model_len=32)
    assert [done[r] for r in rids] == [o.outputs[0].token_ids for o in ample.generate(prompts, params, use_tqdm=False)]
