"""Conformance with vLLM V1's tests/v1/core/test_scheduler.py, test_scheduler_e2e.py and
test_reset_prefix_cache_e2e.py: queues, the token budget, chunked prefill, stop rules,
preemption and what a request reports.

vLLM drives its Scheduler with a mocked model runner; minipaged's scheduler runs inside ``LLM``
with the embedded model, so each case runs real steps (``LLM.run_step``, greedy, token-id
prompts like vLLM's ``create_requests``: request i's prompt is ``[i] * n``) and reads what each
step scheduled. Each test names the vLLM test it follows. Differences that matter here:

- block ids are one lower (no null block) and freed blocks go to the back of the free queue,
  tail first (see test_vllm_prefix_caching.py);
- there is no ``long_prefill_token_threshold`` and chunked prefill is always on: a prompt is cut
  only by the step's token budget;
- requests cannot be finished from outside with a status: ``abort_request`` (finish reason
  "abort") is the one way, and the engine has no ``reset_running_requests``;
- the engine's counters (``kv_stats``) are cumulative; as in vLLM, a resumed request's hits are
  counted apart (``resumed_hit_tokens``, vLLM's preempted-request stats), not as prefix hits.

Left out (no such thing in minipaged), by what they test:

- multimodal inputs, the encoder cache, encoder-decoder models: test_schedule_multimodal_requests,
  test_schedule_partial_requests, test_no_mm_input_chunking, test_ec_connector_*,
  test_*encoder_*, test_*cross_attn*, test_chunked_prefill_disabled_for_encoder_decoder;
- speculative decoding / EAGLE: test_schedule_spec_decoding_stats, test_spec_decode*,
  test_no_spec_tokens_scheduled_for_prefill_chunks, test_scheduler_*eagle*, and the draft tokens
  of test_stop_via_update_from_output;
- KV connectors and remote KV: test_kv_connector_*, test_connector_finish_*,
  test_external_prefix_cache_metrics, test_prefix_cache_query_not_inflated_by_connector_defer,
  test_abort_request_waiting_for_remote_kvs, test_abort_request_finished_recving,
  test_delayed_kv_connector_free_keeps_scheduler_active, test_reset_connector_cache_*,
  test_prepend_skipped_requests_order, test_remote_kv_promotion_*,
  test_fcfs_mixed_skipped_waiting_types_keep_order, test_async_load_reservation_*,
  test_hybrid_per_group_hit_*;
- async scheduling, pipeline parallelism, concurrent batches, output clients:
  test_schedule_concurrent_batches, test_preempt_during_execution, test_async_scheduling_*,
  test_scheduler_stats_route_to_existing_output_client, test_cached_request_data_resumed_*;
- priority scheduling (test_priority_*), structured outputs (test_grammar_*,
  test_schedule_skip_tokenizer_init_structured_output_request,
  test_abort_request_when_structured_output_*), DP prefill throttling
  (test_schedule_prefills_gating, test_throttle_*), min_tokens (test_check_stop_min_tokens),
  prompt logprobs (half of test_schedule);
- a model without a tokenizer (test_schedule_skip_tokenizer_init): every prompt here is token ids,
  which need none.
"""

from __future__ import annotations

import pytest
from conformance_kit import BS, engine, greedy, make_llm, pool_of, run_to_end, step

from minipaged import LLM, SamplingParams
from minipaged.tiny.task import prompt_for


def requests(llm: LLM, num: int, num_tokens: int = 10, max_tokens: int = 16) -> list[int]:
    """vLLM's create_requests: request i asks for ``[i] * num_tokens``."""
    return [llm.add_request([i] * num_tokens, greedy(max_tokens)) for i in range(num)]


def unfinished(llm: LLM) -> int:
    stats = llm.kv_stats()
    return stats["num_waiting"] + stats["num_running"]


# ---- queues ----------------------------------------------------------------------------------


def test_add_requests():
    """test_scheduler.py::test_add_requests: each added request is known and waits, in order."""
    llm = engine(16)
    for i in range(10):
        rid = llm.add_request([i] * 10, greedy(16))
        assert rid == i and not llm.get_output(rid).finished
        assert llm.kv_stats()["num_waiting"] == i + 1


def test_finish_request():
    """test_scheduler.py::test_finish_request: finishing (here: aborting) a waiting request takes
    it off the waiting queue."""
    llm = engine(16)
    ids = requests(llm, 10)
    for i, rid in enumerate(ids):
        llm.abort_request(rid)
        assert llm.kv_stats()["num_waiting"] == 9 - i
        assert llm.get_output(rid).outputs[0].finish_reason == "abort"


def test_get_num_unfinished_requests():
    """test_scheduler.py::test_get_num_unfinished_requests, with 4 running and 6 waiting when the
    requests are finished one by one."""
    llm = engine(16, max_num_seqs=4)
    ids = requests(llm, 10)
    step(llm)
    assert (llm.kv_stats()["num_running"], llm.kv_stats()["num_waiting"]) == (4, 6)
    for i, rid in enumerate(ids):
        llm.abort_request(rid)
        assert unfinished(llm) == 9 - i
        assert llm.has_unfinished_requests() == (i < 9)
    assert pool_of(llm).num_free_blocks == 16


@pytest.mark.parametrize("caching", [False, True])
def test_schedule(caching):
    """test_scheduler.py::test_schedule: ten 10-token prompts all start in the first step, with
    their whole prompt, and move from waiting to running in order."""
    llm = engine(16, caching=caching)
    ids = requests(llm, 10)
    batch, _ = llm.run_step()
    assert [s.request_id for s in batch.seqs] == ids and batch.q_lens == [10] * 10
    stats = llm.kv_stats()
    assert (stats["num_waiting"], stats["num_running"]) == (0, 10)


@pytest.mark.parametrize("caching", [False, True])
def test_schedule_concurrent_partial_requests(caching):
    """test_scheduler.py::test_schedule_concurrent_partial_requests without vLLM's per-request
    prefill cap: three 40-token prompts, 64 tokens a step. Running requests go first, a prompt is
    cut by what is left of the budget, and only a finished prefill samples."""
    llm = engine(16, caching=caching, max_num_batched_tokens=64)
    r0, r1, r2 = requests(llm, 3, num_tokens=40, max_tokens=4)
    s = step(llm)
    assert s.scheduled == {r0: 40, r1: 24} and s.sampled == [r0]
    s = step(llm)
    assert s.scheduled == {r0: 1, r1: 16, r2: 40} and s.sampled == [r0, r1, r2]
    assert step(llm).scheduled == {r0: 1, r1: 1, r2: 1}


def test_schedule_order_is_first_come_first_served():
    """test_scheduler.py::test_schedule_order (chunked prefill on): two long prompts fill the
    budget, the first whole and the second cut; the short ones behind them are not pulled ahead."""
    llm = engine(32, max_num_batched_tokens=128, max_num_seqs=3)
    r1, r2 = (llm.add_request([i] * 80, greedy(4)) for i in (1, 2))
    requests(llm, 2)
    assert step(llm).scheduled == {r1: 80, r2: 48}
    assert llm.kv_stats()["num_waiting"] == 2


def test_waiting_and_running_counts():
    """test_scheduler.py::test_scheduler_stats_waiting_queues (without skipped requests): a budget
    of 100 tokens starts two 50-token prompts and leaves the third waiting."""
    llm = engine(16, max_num_batched_tokens=100)
    r0, r1, _ = requests(llm, 3, num_tokens=50)
    assert step(llm).scheduled == {r0: 50, r1: 50}
    stats = llm.kv_stats()
    assert (stats["num_running"], stats["num_waiting"]) == (2, 1)


# ---- stop rules ------------------------------------------------------------------------------

COPY_HELLO = [97, 98, 99, 256, 104, 101, 108, 108, 111, 257]  # "abc<copy>hello<end>": the model answers "hello"
HELLO, EOS = [104, 101, 108, 108, 111], 258


@pytest.mark.parametrize(
    "params, token_ids, finish_reason, stop_reason",
    [
        (SamplingParams(temperature=0, max_tokens=10), [*HELLO, EOS], "stop", None),  # EOS
        (SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[108]), HELLO[:3], "stop", 108),
        (SamplingParams(temperature=0, max_tokens=3), HELLO[:3], "length", None),
        (SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), [*HELLO, EOS], "length", None),
    ],
    ids=["eos", "stop_token", "max_tokens", "ignore_eos"],
)
def test_stop_via_update_from_output(params, token_ids, finish_reason, stop_reason):
    """test_scheduler.py::test_stop_via_update_from_output (one token a step, no draft tokens):
    a request stops at EOS, at a stop token (kept in the token ids, named by stop_reason), or at
    max_tokens, and runs past EOS with ignore_eos, while the request beside it carries on."""
    llm = make_llm(max_model_len=64)
    rid = llm.add_request(COPY_HELLO, params)
    other = llm.add_request(COPY_HELLO, greedy(12))
    while not llm.get_output(rid).finished:
        step(llm)
    out = llm.get_output(rid).outputs[0]
    n = params.max_tokens if params.ignore_eos else len(token_ids)
    assert out.token_ids[: len(token_ids)] == token_ids and len(out.token_ids) == n
    assert (out.finish_reason, out.stop_reason) == (finish_reason, stop_reason)
    assert not llm.get_output(other).finished and llm.kv_stats()["num_running"] == 1


# ---- memory: waiting for blocks, preemption, leaks -------------------------------------------


def test_request_waits_until_blocks_are_free():
    """test_scheduler.py::test_kv_connector_unable_to_allocate, without a connector: of two
    24-token prompts on 9 blocks of 4, the second waits until the first has finished and freed
    everything, then runs."""
    llm = engine(9, block_size=4)
    r0, r1 = requests(llm, 2, num_tokens=24, max_tokens=2)
    assert step(llm).scheduled == {r0: 24}
    assert (llm.kv_stats()["num_running"], llm.kv_stats()["num_waiting"]) == (1, 1)
    assert step(llm).scheduled == {r0: 1}
    assert pool_of(llm).num_free_blocks == 9 and llm.kv_stats()["num_waiting"] == 1
    assert step(llm).scheduled == {r1: 24}
    run_to_end(llm)
    assert pool_of(llm).num_free_blocks == 9


def test_preemption_frees_the_newest_and_resumes_with_its_cached_blocks():
    """test_scheduler.py::test_kv_connector_handles_preemption, without a connector (block size 2,
    6 blocks, two 5-token prompts, 4 tokens each): when the pool is full the newest request is
    preempted; once the other finishes it comes back, hitting its own first blocks (its tail block
    was freed first and reused), and ends with the tokens it would have had alone."""
    alone = engine(6, block_size=2).generate([[1] * 5], greedy(4), use_tqdm=False)[0].outputs[0].token_ids
    llm = engine(6, block_size=2)
    r0, r1 = requests(llm, 2, num_tokens=5, max_tokens=4)
    assert step(llm).scheduled == {r0: 5, r1: 5}
    assert step(llm).scheduled == {r0: 1, r1: 1}
    s = step(llm)  # r0 needs a 4th block: r1, the newest, gives up its 3
    assert s.scheduled == {r0: 1} and s.preempted == [r1]
    assert (llm.kv_stats()["num_running"], llm.kv_stats()["num_waiting"]) == (1, 1)
    assert step(llm).scheduled == {r0: 1} and llm.get_output(r0).finished
    assert pool_of(llm).num_free_blocks == 6
    assert step(llm).scheduled == {r1: 3}  # 7 tokens, 4 of them from r1's own cached blocks
    run_to_end(llm)
    assert llm.get_output(r1).outputs[0].token_ids == alone
    assert llm.kv_stats()["num_preemptions"] == 1 and pool_of(llm).num_free_blocks == 6


def test_memory_leak():
    """test_scheduler.py::test_memory_leak: requests added one step apart all finish and give
    every block back (cached ones keep their hash until reused: eviction is lazy)."""
    llm = engine(16)
    for i in range(5):
        llm.add_request([i] * 10, greedy(10))
        step(llm)
    run_to_end(llm)
    pool = pool_of(llm)
    pool.check_invariants()
    assert pool.num_free_blocks == 16 and all(b.ref_cnt == 0 for b in pool.blocks)
    stats = llm.kv_stats()
    assert (stats["num_running"], stats["num_waiting"]) == (0, 0) and stats["cached_blocks"] == 5


# ---- prefix-cache figures and reset ----------------------------------------------------------


def test_prefix_cache_stats_not_recorded_when_caching_disabled():
    """test_scheduler.py::test_prefix_cache_stats_not_recorded_when_caching_disabled: with caching
    off nothing counts as a hit, not even a repeated prompt."""
    llm = engine(16, caching=False)
    outs = [llm.generate([[0] * 33], greedy(2), use_tqdm=False)[0] for _ in range(2)]
    assert [o.num_cached_tokens for o in outs] == [0, 0] and llm.kv_stats()["prefix_hit_tokens"] == 0


def test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request():
    """test_scheduler.py::test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request:
    a request with a real hit that is refused admission once and admitted on the next step counts
    its hit once."""
    llm = engine(6)
    llm.generate([[0] * (2 * BS)], greedy(1), use_tqdm=False)  # 2 blocks cached
    holder = llm.add_request([1] * 40, greedy(2))
    step(llm)  # the holder takes 3 blocks: 3 left, the 2 cached among them
    retried = llm.add_request([0] * (4 * BS), greedy(1))  # hits 2 blocks, needs 2 more: 4 > 3
    assert step(llm).scheduled == {holder: 1} and llm.kv_stats()["prefix_hit_tokens"] == 0
    assert step(llm).scheduled == {retried: 2 * BS}
    assert llm.kv_stats()["prefix_hit_tokens"] == 2 * BS
    assert llm.get_output(retried).num_cached_tokens == 2 * BS


def test_concurrent_partial_prefill():
    """test_scheduler_e2e.py::test_concurrent_partial_prefill: three copies of a prompt under a
    6-token budget all complete, with one output each and the same greedy tokens; the later two
    are admitted with the first block the first one cached."""
    llm = make_llm(enable_prefix_caching=True, max_num_batched_tokens=6, max_num_seqs=3, max_model_len=64)
    outs = llm.generate(["Hello my name is Robert and I"] * 3, greedy(8), use_tqdm=False)
    assert len(outs) == 3 and all(len(o.outputs) == 1 and o.finished for o in outs)
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids == outs[2].outputs[0].token_ids
    assert [o.num_cached_tokens for o in outs] == [0, BS, BS]


def test_scheduler_reset_prefix_cache():
    """test_scheduler.py::test_scheduler_reset_prefix_cache: the reset fails while requests run and
    hold blocks (even with nothing cached: ten 10-token prompts fill no block), and succeeds once
    they are done. (vLLM's reset_running_requests=True, which preempts them, has no counterpart.)"""
    llm = engine(16)
    requests(llm, 10, max_tokens=2)
    step(llm)
    assert llm.kv_stats()["num_running"] == 10
    assert llm.reset_prefix_cache() is False
    assert llm.kv_stats()["num_running"] == 10
    run_to_end(llm)
    assert llm.reset_prefix_cache() is True


def test_reset_prefix_cache_e2e():
    """test_reset_prefix_cache_e2e.py::test_reset_prefix_cache_e2e, between runs (minipaged cannot
    reset under running requests): outputs are the same after a reset, which served nothing from
    the cache, as without it."""
    llm = make_llm(enable_prefix_caching=True, max_model_len=256)
    preamble = "the quick brown fox jumps over the lazy dog and runs far away "
    prompts = [prompt_for(t, preamble) for t in ("a robot", "to be or not", "the fox")]
    sp = SamplingParams(temperature=0, max_tokens=24)
    first = llm.generate(prompts, sp, use_tqdm=False)
    assert [o.outputs[0].text for o in first] == ["a robot", "to be or not", "the fox"]
    assert llm.reset_prefix_cache() is True
    again = llm.generate(prompts, sp, use_tqdm=False)
    assert [o.outputs[0].text for o in again] == [o.outputs[0].text for o in first]
    # Nothing is left from the first run: the first prompt computes everything again, and the other
    # two share with it exactly what they shared the first time.
    assert again[0].num_cached_tokens == 0
    assert [o.num_cached_tokens for o in again] == [o.num_cached_tokens for o in first]


# ---- what a request reports (a bug being fixed: remove the mark once the fix lands) ----------


def test_num_cached_tokens_is_set_at_first_scheduling():
    """vLLM sets a request's num_cached_tokens once, when it is first scheduled (see
    test_scheduler.py::test_preemption_re_records_prefix_cache_query: a resume's lookup is recorded
    apart, as a preempted request's). Here b is preempted and resumes on two of its own cached
    blocks; its output must still say 0 (minipaged said 16). The larger case (16-token blocks, 8
    of them, 20-token prompts, 60 tokens each: 48 instead of 0) behaves the same in 75 steps."""
    llm = engine(6, block_size=8)
    sp = greedy(16)
    a = llm.add_request([97 + i % 26 for i in range(10)], sp)
    b = llm.add_request([65 + i % 26 for i in range(10)], sp)
    run_to_end(llm)
    assert llm.kv_stats()["num_preemptions"] == 1
    assert llm.get_output(a).num_cached_tokens == 0
    assert llm.get_output(b).num_cached_tokens == 0
    stats = llm.kv_stats()  # the resume's hit is a preempted request's, not a prefix hit
    assert stats["prefix_hit_tokens"] == 0 and stats["resumed_hit_tokens"] == 16
