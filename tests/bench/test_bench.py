"""The benchmarks of ``minipaged/bench/``, on small inputs: the figures they print must say what docs/ quotes.

No timing is asserted: only what the benches count (slots, blocks, tokens, sequences) and
their outputs' agreement. The full ``bench engine`` run (a random Qwen3 against transformers)
is not run here; its parts are, on the embedded model.
"""

from __future__ import annotations

import pytest

from minipaged import LLM, SamplingParams
from minipaged.bench import engine, kernels, memory, prefix
from minipaged.bench.step_timer import PHASES, StepTimer
from minipaged.model.tokenizer import ByteTokenizer
from minipaged.tiny import task


# -- bench memory --------------------------------------------------------------------------------
def _memory_rows(out: str) -> dict[str, list[str]]:
    """Label -> the numbers of its row, from the table ``bench memory`` prints."""
    rows = {}
    for line in out.splitlines():
        label, _, rest = line.partition("  ")
        if label.startswith(("paged", "contiguous")):
            rows[label] = rest.replace("%", "").replace("/", " ").split()
    return rows


def test_bench_memory_paged_holds_more_tokens_and_runs_more_requests(capsys):
    memory.main(["--requests", "40", "--slots", "2048", "--max-seq-len", "256"])
    out = capsys.readouterr().out
    rows = _memory_rows(out)
    assert set(rows) == {
        "paged, 128 blocks of 16",
        "contiguous, reserve max_seq_len",
        "contiguous, reserve exact (oracle)",
    }
    # columns: holding tokens %, steps, mean running, peak running, fragmentation %, preemptions
    paged, reserve_max = rows["paged, 128 blocks of 16"], rows["contiguous, reserve max_seq_len"]
    assert float(paged[0]) > 90 > float(reserve_max[0])  # paged wastes at most the last block's tail
    assert int(paged[3]) > int(reserve_max[3])  # more requests at once on the same slots
    assert int(paged[1]) < int(reserve_max[1])  # so the trace is served in fewer steps
    assert float(paged[4]) == 0.0  # blocks never fragment externally
    # the number format: SmolLM2's block of 16 is 30 layers x 16 tokens x 3 KV heads x 64 x K,V
    fp32_block = 30 * 16 * 3 * 64 * 2 * 4  # 737,280 bytes: 1,456 blocks in 1 GiB
    assert f"fp32 {2**30 // fp32_block:,} blocks ({2**30 // fp32_block * 16:,} tokens)" in out
    assert "bf16 2,912 blocks (46,592 tokens): 2x the blocks in bf16" in out


# -- bench prefix --------------------------------------------------------------------------------
@pytest.mark.slow
def test_bench_prefix_meets_the_sharing_targets():
    """16 requests sharing a 512-token preamble: prefill tokens and peak blocks both fall by > 85%."""
    f = prefix.shared_preamble(num_requests=16, preamble_len=512, block_size=16, seed=3)
    assert f[False]["hits"] == 0 and f[True]["hits"] > 0
    assert 1 - f[True]["prefill"] / f[False]["prefill"] > 0.85
    assert 1 - f[True]["peak_blocks"] / f[False]["peak_blocks"] > 0.85


@pytest.mark.slow
def test_bench_prefix_parallel_samples_share_the_prompts_full_blocks():
    """n samples of one prompt hold n - 1 fewer copies of its full blocks; the partial last block is copied."""
    rows = prefix.parallel_sampling([2, 3], prompt_len=64, max_tokens=8, block_size=16, seed=0)
    # the prompt: 64 preamble characters + <copy> + 40 text characters + <end> = 106 tokens: 6 full blocks
    assert [r["n"] for r in rows] == [2, 3]
    for r in rows:
        assert r["independent"] - r["shared"] == (r["n"] - 1) * 6
        assert r["cow"] == r["n"] - 1


# -- bench kernels -------------------------------------------------------------------------------
def test_peak_bandwidth_is_matched_by_the_most_specific_name():
    assert kernels.peak_gbps_for("NVIDIA H200") == 4800.0
    assert kernels.peak_gbps_for("NVIDIA H100 PCIe") == 2000.0  # not the SXM H100's figure
    assert kernels.peak_gbps_for("NVIDIA H100 80GB HBM3") == 3350.0
    assert kernels.peak_gbps_for("Some Future GPU") is None


def test_gh200_is_not_read_as_h200():
    """The name "GH200" contains "H200": the table's GH200 entry must be matched before H200's."""
    assert kernels.peak_gbps_for("NVIDIA GH200 480GB") == kernels.PEAK_GBPS["GH200"]


@pytest.mark.slow
def test_bench_kernels_quick_on_cpu_agrees_with_the_reference(capsys):
    rows = kernels.run(device="cpu", quick=True)
    out = capsys.readouterr().out
    assert "interpreter" in out  # the CPU figures say they are not kernel speed
    impls = {r["impl"] for r in rows}
    assert {"triton", "torch-ref", "sdpa-contig"} <= impls
    assert {r["op"] for r in rows} == {"decode", "prefill"}
    for r in rows:
        assert r["ms"] > 0 and r["bytes"] > 0 and r["peak_fraction"] is None
        if r["impl"] == "triton":
            assert r["interpreted"]
            assert r["max_abs_err"] < 1e-5  # fp32, same semantics as the reference


# -- bench engine --------------------------------------------------------------------------------
def test_workloads_are_seeded_and_in_range():
    a, b = engine.token_workload(20, seed=1, vocab=512), engine.token_workload(20, seed=1, vocab=512)
    assert a == b and a != engine.token_workload(20, seed=2, vocab=512)
    for prompt, n in a:
        assert 16 <= len(prompt) <= 200 and 8 <= n <= 128 and all(0 <= t < 512 for t in prompt)
    copies = engine.copy_workload(6, seed=0)
    assert copies == engine.copy_workload(6, seed=0)
    for prompt, n in copies:
        preamble, _, rest = prompt.partition(task.COPY)
        assert 40 <= len(preamble) <= 400 and rest.endswith(task.END) and 20 <= n <= 200


@pytest.mark.slow
def test_paged_runs_more_sequences_than_contiguous_on_one_budget(capsys):
    """The same copy requests on 64 blocks x 16 slots, max_model_len 512: a contiguous cache
    reserves 512 slots per sequence, so 2 fit; the paged cache runs all 4, with the same tokens."""
    requests = [(p, 8) for p, _ in engine.copy_workload(4, seed=0)]
    paged, contiguous = engine.paged_vs_contiguous(
        None, requests, num_kvcache_blocks=64, max_num_seqs=4, max_model_len=512
    )
    assert "paged / contiguous" in capsys.readouterr().out
    assert paged.tokens == contiguous.tokens
    assert [len(t) for t in paged.tokens] == [8] * 4
    assert paged.output_tokens == 32
    assert max(paged.running) == 4 and max(contiguous.running) == 2
    assert paged.utilization > contiguous.utilization
    assert len(paged.stats) == len(paged.running) == len(paged.steps)  # one kv_stats() per step
    # every step is counted: its decode rows and prefill tokens add up to what was computed
    tokenizer = ByteTokenizer(task.SPECIAL_TOKENS, task.EOS)
    computed = sum(len(t) - 1 for t in contiguous.tokens) + sum(len(tokenizer.encode(p)) for p, _ in requests)
    assert sum(d + p for _, d, p in contiguous.steps) == computed


def test_step_cost_fit_recovers_known_costs():
    """Steps timed as 1 ms + 50 us per decode row + 20 us per prefill token give back those costs."""
    run = engine.EngineRun("synthetic")
    for d, p in [(1, 0), (4, 0), (9, 0), (2, 300), (0, 120), (7, 40), (3, 0), (5, 500)]:
        run.steps.append((1e-3 + 50e-6 * d + 20e-6 * p, d, p))
    cost = engine.StepCost.fit([run])
    assert cost.per_step == pytest.approx(1e-3) and cost.per_decode == pytest.approx(50e-6)
    assert cost.per_prefill == pytest.approx(20e-6)
    assert cost.seconds(10, 100, 1000) == pytest.approx(10e-3 + 5e-3 + 20e-3)


def test_fewest_steps_is_slots_held_over_pool_slots():
    # prompt 3 + 2 outputs, block size 4: one block (4 slots) in each of its 2 steps; prompt 4 + 3
    # outputs: 4 tokens fit one block, 5 and 6 need two -> 4 + 8 + 8 slots. 28 slots / 8 = 4 steps.
    assert engine.fewest_steps([(3, 2), (4, 3)], block_size=4, num_slots=8) == 4
    # a huge pool still needs the longest output's steps
    assert engine.fewest_steps([(3, 2), (4, 3)], block_size=4, num_slots=10**6) == 3


@pytest.mark.slow
def test_explain_prints_where_the_time_goes(capsys):
    requests = [(p, 6) for p, _ in engine.copy_workload(4, seed=1)]
    paged, contiguous = engine.paged_vs_contiguous(
        None, requests, num_kvcache_blocks=64, max_num_seqs=4, max_model_len=512
    )
    out = capsys.readouterr().out
    tokenizer = ByteTokenizer(task.SPECIAL_TOKENS, task.EOS)
    steps = engine.fewest_steps([(len(tokenizer.encode(p)), n) for p, n in requests], 16, 64 * 16)
    assert steps >= 6  # at least the 6 output tokens' steps
    assert "step cost (fitted to both engines'" in out and f"the fewest steps this pool allows ({steps})" in out
    # 2 contiguous reservations against 4 paged sequences: more steps for the contiguous cache
    step_ratio = len(contiguous.steps) / len(paged.steps)
    assert step_ratio > 1
    assert (
        f"if a step cost the same whatever its rows: contiguous time / paged time {step_ratio:.2f}x for these "
        f"runs, {len(contiguous.steps) / steps:.2f}x in the fewest steps"
    ) in out


def test_step_timer_splits_a_step_and_patches_nothing():
    llm = LLM(max_num_seqs=4, num_kvcache_blocks=32)
    for i in range(4):
        llm.add_request(task.prompt_for(f"text {i}"), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    llm.step()  # the prefills
    with StepTimer(llm) as timer:
        for _ in range(3):
            llm.run_step()
    shares = timer.shares()
    assert list(shares) == [*PHASES, "other"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert all(shares[p] > 0 for p in PHASES)
    assert timer.seconds["forward"] >= timer.seconds["attention"]  # attention is timed inside the forward
    assert timer.steps == 3 and llm.observers == []  # it read the steps' outputs, and unsubscribed
    # nothing was wrapped: the engine ran its own methods all along
    assert "schedule" not in vars(llm.scheduler) and "prepare" not in vars(llm.runner)
    assert "forward" not in vars(llm.model) and "run_step" not in vars(llm) and "sample" not in vars(llm.runner)


def test_step_split_at_running_decodes():
    shares = engine.step_split(None, num_seqs=4, decode_steps=2)
    assert set(shares) == {*PHASES, "other"}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert 0 < shares["forward"] < 1
