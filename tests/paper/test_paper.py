"""``minipaged.paper``: every figure's quick variant returns sane, structured figures; the CLI saves them.

Nothing here asserts a time or a ratio of times (those are what ``python -m minipaged paper``
prints). What is asserted is what the runs count: slots, blocks, batch sizes, prefill tokens,
identical tokens, and the paper's orderings on the simulated figures. The measured figures run
on the embedded model here (``model=None``): the engine's behaviour is the same, each step is
cheaper than ``random:smollm2-135m``'s.
"""

from __future__ import annotations

import json
import time

import pytest

from minipaged import LLM, SamplingParams
from minipaged.__main__ import main
from minipaged.paper import kv_bytes, plots, registry, workloads
from minipaged.paper.engines import StepRecorder, greedy, make_llm, saturated_rate, serve_at_rate

ORDER = ("orca-max", "orca-pow2", "orca-oracle", "paged")


# -- §3 -------------------------------------------------------------------------------------------
def test_opt13b_costs_800_kb_per_token():
    """2 (K, V) x 40 layers x 5120 hidden x 2 bytes (fp16): the paper's 800 KB, 1.6 GB for 2,048 tokens."""
    opt = dict(model_type="opt", hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, torch_dtype="float16")
    assert kv_bytes.kv_bytes_per_token(opt) == 819_200 == 800 * 1024
    assert 2048 * kv_bytes.kv_bytes_per_token(opt) == 1600 * 2**20
    assert kv_bytes.kv_bytes_per_token(opt, dtype="float32") == 2 * 819_200


def test_grouped_query_models_store_only_their_kv_heads():
    smollm2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64)
    assert kv_bytes.kv_bytes_per_token(smollm2) == 2 * 30 * 3 * 64 * 4  # fp32 by default
    with pytest.raises(ValueError, match="unknown dtype 'float12'"):
        kv_bytes.kv_bytes_per_token(smollm2, dtype="float12")


# -- traces ---------------------------------------------------------------------------------------
def test_paper_traces_have_the_papers_mean_lengths():
    for shape in (workloads.SHAREGPT, workloads.ALPACA):
        trace = workloads.paper_trace(shape, 300, seed=4)
        means = workloads.mean_lengths(trace)
        assert means["prompt"] == pytest.approx(shape.mean_prompt, rel=0.01)
        assert means["output"] == pytest.approx(shape.mean_output, rel=0.01)
        assert all(r.arrival == 0 and 1 <= r.output_len and r.total_len <= 2048 for r in trace)
        assert trace == workloads.paper_trace(shape, 300, seed=4)


def test_a_shared_prefix_stays_whole_and_the_rest_is_alpaca_shaped():
    trace = workloads.paper_trace(workloads.ALPACA, 200, 0, max_len=512, shared_prefix_len=80, num_prefixes=1)
    assert all(r.prefix_len == 80 and r.prompt_len > 80 and r.total_len <= 512 for r in trace)
    own = sum(r.prompt_len - 80 for r in trace) / len(trace)
    assert own == pytest.approx(workloads.ALPACA.mean_prompt, rel=0.02)
    ids = workloads.engine_requests(trace[:2], vocab_size=100)
    assert ids[0][0][:80] == ids[1][0][:80] and ids[0][0][80:] != ids[1][0][80:]


# -- Fig. 2 and Fig. 13 (simulated) ---------------------------------------------------------------
@pytest.fixture(scope="module")
def fig2():
    return registry.run("fig2", quick=True)


@pytest.fixture(scope="module")
def fig13():
    return registry.run("fig13", quick=True)


def test_fig2_orders_the_systems_as_the_paper_does(fig2):
    for runs in (fig2.data, fig2.data["sharegpt-real"]):  # lognormal lengths, then the real file's
        shares = [runs[s]["tokens"] for s in ORDER]
        assert shares == sorted(shares) and len(set(shares)) == 4  # Max < Pow2 < Oracle < paged
        assert shares[-1] > 0.95 and shares[0] < 0.3
        for s in ORDER:  # every slot is accounted for once
            d = runs[s]
            assert d["tokens"] + d["reservation"] + d["internal"] + d["free"] == pytest.approx(1.0)
        assert runs["orca-oracle"]["internal"] == pytest.approx(0.0)  # the oracle never over-reserves
    assert [r.paper for r in fig2.rows] == [20.4, 26.8, 38.2, 96.3] * 2
    assert [r.label for r in fig2.rows][4] == "ShareGPT (real lengths), Orca (Max), holding tokens"
    real = fig2.data["sharegpt-real"]["trace"]  # 150 requests of seed 0, in SmolLM2's tokens
    assert real["requests"] == 150 and 150 < real["prompt"] < 400 and 150 < real["output"] < 400


def test_fig13_batch_sizes_order_as_the_papers(fig13):
    for trace in ("sharegpt", "sharegpt-real", "alpaca"):
        batch = [fig13.data[trace][s]["batch"] for s in ORDER]
        assert batch == sorted(batch)
        assert batch[0] == 7.0  # seven 2,048-token reservations fit, as Orca (Max)'s 7.00 in the paper
    assert fig13.data["sharegpt"]["paged"]["batch"] > 3.5 * 7.0
    assert fig13.data["alpaca"]["paged"]["batch"] > fig13.data["sharegpt"]["paged"]["batch"]  # shorter requests


# -- the engine helpers ---------------------------------------------------------------------------
def test_the_orca_systems_are_the_contiguous_layout_with_their_reservation():
    for system, rule in (("orca-max", "max"), ("orca-pow2", "pow2"), ("orca-oracle", "oracle")):
        llm = make_llm(system, None, num_kvcache_blocks=16, max_model_len=128)
        assert llm.kv_stats()["kv_layout"] == "contiguous" and llm.config.contiguous_reserve == rule
    assert make_llm("paged", None, num_kvcache_blocks=16, max_model_len=128).kv_stats()["kv_layout"] == "paged"


def test_step_recorder_reads_every_step_and_leaves_the_engine_as_it_was():
    llm = LLM(num_kvcache_blocks=32, max_model_len=128)
    with StepRecorder(llm) as rec:
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert len(rec.stats) == 5  # one prefill step, four decode steps
    assert [s["tokens_held"] for s in rec.stats] == [3, 4, 5, 6, 7]  # the last step's sequence finished after it
    assert llm.observers == []


def test_serving_at_a_rate_finishes_every_request_after_it_arrives(monkeypatch):
    llm = LLM(num_kvcache_blocks=64, max_model_len=256)
    requests = [([1 + i, 2, 3, 4], 4 + i) for i in range(6)]

    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"slept {seconds} s: an idle gap must be skipped on the clock")

    monkeypatch.setattr(time, "sleep", no_sleep)
    slow = serve_at_rate(llm, requests, rate=0.01, seed=0)  # one request every ~100 s: never two at once
    fast = serve_at_rate(llm, requests, rate=1e6, seed=0)  # all at once
    for served in (slow, fast):
        assert len(served["latencies"]) == 6 and all(t > 0 for t in served["latencies"])
        assert served["busy_seconds"] <= served["seconds"]
    assert slow["seconds"] > 100  # the clock crossed the idle gaps (skipped, not slept: see no_sleep)
    assert not llm.has_unfinished_requests()
    alone = LLM(num_kvcache_blocks=64, max_model_len=256)
    for i, (prompt, n) in enumerate(requests):  # each stream is what the request gives run alone
        expected = alone.generate([prompt], greedy(n), use_tqdm=False)[0].outputs[0].token_ids
        assert slow["tokens"][i] == fast["tokens"][i] == expected


@pytest.mark.parametrize("system", ["orca-max", "paged"])
def test_the_saturated_rate_times_only_full_steps_and_leaves_the_engine_empty(system):
    # 12 slots of 4 tokens; Orca (Max) reserves max_model_len = 16 tokens (4 blocks): 3 run at once.
    llm = make_llm(system, None, num_kvcache_blocks=12, block_size=4, max_model_len=16)
    requests = [([1 + i, 2, 3], 5) for i in range(20)]
    full = saturated_rate(llm, requests)
    assert full["rate"] > 0 and full["tokens_per_s"] == pytest.approx(5 * full["rate"])
    most = 3 if system == "orca-max" else 12  # paged memory admits a request while its prompt's block fits
    assert 1 <= full["mean_running"] <= most and full["steps"] >= 2
    assert not llm.has_unfinished_requests() and llm.kv_stats()["num_waiting"] == 0
    assert llm.kv_stats()["num_free_blocks"] == 12
    assert full["finished"]  # the first requests finish while later ones still wait
    short = saturated_rate(llm, requests, window=2)  # stops after 2 requests' worth of tokens (10)
    assert short["steps"] < full["steps"] and short["tokens_per_s"] > 0 and not llm.has_unfinished_requests()
    for i, out in full["finished"].items():
        prompt, n = requests[i]
        alone = LLM(num_kvcache_blocks=12, block_size=4, max_model_len=16)
        assert out == alone.generate([prompt], greedy(n), use_tqdm=False)[0].outputs[0].token_ids


# -- the measured figures, on the embedded model --------------------------------------------------
def test_fig12_runs_every_system():
    res = registry.run("fig12", quick=True, model=None)
    assert set(res.data["capacity"]) == set(ORDER)
    assert res.data["tokens_identical"]
    for curve in res.data["curves"].values():
        assert curve and all(p["normalized_latency"] > 0 for p in curve)
        assert [p["rate"] for p in curve] == res.data["rates"][: len(curve)]
    labels = [r.label for r in res.rows]
    assert "paged / Orca (Max), sustained rate" in labels


def test_fig15_more_samples_save_more():
    res = registry.run("fig15", quick=True, model=None)
    saved = [res.data["parallel"][str(n)] for n in (2, 4, 6)]
    assert 0 < saved[0] < saved[1] < saved[2] < 100
    beam = [res.data["beam"][str(w)] for w in (2, 4, 6)]
    # beams also share their generated blocks once they outgrow a block: wider beams share more
    assert beam[0] < beam[1] < beam[2] and all(b >= s for b, s in zip(beam, saved)) and beam[2] > saved[2]
    v = res.data["v0_vs_v1"]
    assert v["v1"]["prefill_tokens"] > v["v0"]["prefill_tokens"]  # each request prefills the prompt's partial block
    assert v["beam_outside"]["prefill_per_token"] > 1  # every step recomputes each beam's last block


def test_fig16_prefix_caching_prefills_the_prefix_once():
    res = registry.run("fig16", quick=True, model=None)
    for prefix_len in ("80", "341"):
        rates = res.data["requests_per_s"][prefix_len]
        assert "paged" in rates and "orca-max" in rates
        # 4 requests: the prefix once, then each request's own tokens (and what preemption recomputes)
        assert res.data["prefill_tokens"][prefix_len] < 4 * int(prefix_len)
    assert all("the same tokens: True" in n for n in res.notes)


def test_fig18b_bigger_blocks_hold_fewer_tokens():
    res = registry.run("fig18b", quick=True, model=None)
    for trace in ("sharegpt", "sharegpt-real", "alpaca"):
        shares = list(res.data["memory_tokens_share"][trace].values())
        assert shares == sorted(shares, reverse=True) and shares[0] > 0.98
    assert set(res.data["tokens_per_s"]) == {"4", "16", "64"}
    assert res.data["tokens_identical"]


def test_fig19_swaps_and_recomputes_the_same_tokens():
    res = registry.run("fig19", quick=True, model=None)
    for row in res.data["block_sizes"].values():
        assert row["tokens_identical"] and row["swapped_blocks"] > 0 and row["recomputed_blocks"] > 0


@pytest.mark.slow  # builds random:smollm2-135m (134.5M parameters) and runs it
def test_the_throughput_regime_compares_both_models():
    res = registry.run("regime", quick=True, num_requests=2, rows=(1, 2), decode_steps=1, max_output=3)
    for model in ("embedded", "smollm2"):
        d = res.data[model]
        assert d["tokens_identical"] and set(d["decode_step_seconds"]) == {"1", "2"}
        assert set(d["tokens_per_s"]) == {"paged", "contiguous"}


def test_quick_sizes_stay_small():
    """The quick variants of the measured figures are smoke runs: a few requests of a few tokens on the engine."""
    for name, entry in registry.FIGURES.items():
        if name in ("fig2", "fig13"):  # replays without a model: thousands of requests cost seconds
            continue
        q = entry.quick
        assert q.get("max_output", q.get("max_tokens", 8)) <= 16, name
        for key in ("num_requests", "capacity_requests", "curve_requests", "engine_requests"):
            assert q.get(key, 0) <= 6, (name, key)


# -- the command line -----------------------------------------------------------------------------
def test_cli_prints_and_saves_each_figure(tmp_path, capsys):
    main(["paper", "kv-bytes", "fig2", "--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "§3: KV cache bytes per token" in out and "800 KiB" in out and "[simulated, quick]" in out
    saved = json.loads((tmp_path / "fig2.quick.json").read_text())
    assert saved["kind"] == "simulated" and saved["quick"] and saved["rows"][0]["paper"] == 20.4
    assert (tmp_path / "kv-bytes.quick.json").exists()
    with pytest.raises(SystemExit, match="unknown figure 'fig99'"):
        main(["paper", "fig99", "--out", str(tmp_path)])


def test_every_figure_is_registered_with_the_papers_numbers():
    assert set(registry.FIGURES) == {
        "kv-bytes",
        "fig2",
        "fig13",
        "fig12",
        "fig15",
        "fig16",
        "fig18b",
        "fig19",
        "regime",
    }
    assert all(entry.paper and entry.section for entry in registry.FIGURES.values())


# -- pictures -------------------------------------------------------------------------------------
def test_plots_draw_the_saved_results(fig2, fig13):
    fig = plots.draw_memory_shares(fig2.to_dict())
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["Orca (Max)", "Orca (Pow2)", "Orca (Oracle)", "paged"]
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [20.4, 26.8, 38.2, 96.3]  # the paper's ticks
    assert len(ax.patches) == 4 * 4  # four parts of every system's memory
    real = plots.draw_memory_shares(fig2.to_dict(), trace="sharegpt-real").axes[0]
    assert [line.get_xdata()[0] for line in real.get_lines()] == [20.4, 26.8, 38.2, 96.3]
    beside = plots.draw_beside_paper(fig13.to_dict(), unit="")
    assert len(beside.axes[0].patches) == 2 * 12  # ours and the paper's, 4 systems x 3 traces
    curves = {
        "title": "t",
        "kind": "measured",
        "quick": True,
        "data": {"curves": {"paged": [{"rate": 1.0, "normalized_latency": 0.1}]}, "capacity": {"paged": 2.0}},
    }
    assert plots.draw_latency(curves).axes[0].get_title(loc="left") == "t  [measured, quick run]"
