"""``bench serve`` on short runs: it prints every figure vLLM's serving benchmark prints.

No timing is asserted: only that each figure is there and is a number, that every request
succeeded, and (offline comparison) that the texts through the server equal ``LLM.generate``'s.
"""

from __future__ import annotations

import argparse
import math
import re

import pytest

pytest.importorskip("fastapi", reason='the server needs its libraries: pip install -e ".[serve]"')
from serve.harness import ServerThread

from minipaged import LLM
from minipaged.bench import serve as bench_serve
from minipaged.paper import sharegpt
from minipaged.serve.app import create_app

FIGURES = [
    "Successful requests:",
    "Benchmark duration (s):",
    "Total input tokens:",
    "Total generated tokens:",
    "Request throughput (req/s):",
    "Output token throughput (tok/s):",
    "Total token throughput (tok/s):",
    "Output tok/s per request (mean):",
] + [f"{stat} {name} (ms):" for name in ("TTFT", "TPOT", "ITL") for stat in ("Mean", "Median", "P99")]


def figures(out: str) -> dict[str, list[float]]:
    """Each figure's values, in the order printed (one per server)."""
    found: dict[str, list[float]] = {}
    for line in out.splitlines():
        for name in FIGURES:
            if line.startswith(name):
                found.setdefault(name, []).append(float(line[len(name) :]))
    return found


def test_bench_serve_prints_every_figure(capsys):
    llm = LLM(num_kvcache_blocks=64, max_num_seqs=8, enable_prefix_caching=True)
    with ServerThread(create_app(llm, model_name="tiny-copy")) as s:
        bench_serve.main(
            ["--base-url", s.url, "--num-prompts", "8", "--request-rate", "20", "--max-concurrency", "4"]
            + ["--max-tokens", "12", "--ignore-eos", "--preamble-chars", "40", "--watch-projector"]
        )
    out = capsys.readouterr().out
    found = figures(out)
    assert set(found) == set(FIGURES), set(FIGURES) - set(found)
    assert all(math.isfinite(v[0]) and v[0] >= 0 for v in found.values())
    assert found["Successful requests:"] == [8] and found["Total generated tokens:"] == [8 * 12]
    # one client's rate: at most 4 in flight, so each sees at least a quarter of the total
    assert found["Output tok/s per request (mean):"][0] > 0.2 * found["Output token throughput (tok/s):"][0]
    assert "Failed requests:                                 0" in out
    assert re.search(r"projector: [\d.]+ frames/s pushed during the run", out)


@pytest.mark.slow
def test_bench_serve_compares_paged_contiguous_and_offline(capsys):
    """Two servers started by the bench (subprocesses), one KV budget; LLM.generate beside them."""
    bench_serve.main(
        ["--num-prompts", "6", "--max-concurrency", "3", "--max-tokens", "8", "--ignore-eos", "--preamble-chars", "20"]
        + ["--kv-layout", "paged,contiguous", "--num-kvcache-blocks", "64", "--max-model-len", "128"]
        + ["--compare-offline"]
    )
    out = capsys.readouterr().out
    found = figures(out)
    assert found["Successful requests:"] == [6, 6] and found["Total generated tokens:"] == [48, 48]
    assert "Serving Benchmark Result: paged" in out and "Serving Benchmark Result: contiguous" in out
    assert out.count("texts identical 6/6") == 2
    assert re.search(r"paged / contiguous: output tokens/s x[\d.]+", out)


@pytest.mark.slow  # reads the 126 MB ShareGPT file (token lengths from the cache)
def test_the_sharegpt_dataset_is_sampled_as_vllms_benchmark_samples_it():
    args = argparse.Namespace(dataset="sharegpt", num_prompts=5, seed=0, sharegpt_output_len=None)
    work = bench_serve.workload(args)
    expected = sharegpt.sample_requests(5, seed=0)
    assert work == [(r.prompt, r.output_len) for r in expected]  # the first turn, max_tokens = the second's length
    assert all(4 <= r.prompt_len <= 1024 and r.output_len >= 4 for r in expected)
    assert all(r.prompt_len + r.output_len <= 2048 for r in expected)
    lengths = sharegpt.default_lengths()  # another seed, other requests
    assert sharegpt.sample_indices(lengths, 5, seed=1) != sharegpt.sample_indices(lengths, 5, seed=0)


@pytest.mark.slow  # serves the real model (538 MB in fp32)
def test_bench_serve_sends_real_sharegpt_prompts_to_the_real_model(real_model, capsys):
    llm = LLM(real_model, num_kvcache_blocks=160, max_model_len=2048)
    with ServerThread(create_app(llm, model_name="smollm2")) as s:
        bench_serve.main(
            ["--base-url", s.url, "--dataset", "sharegpt", "--num-prompts", "2", "--sharegpt-output-len", "3"]
            + ["--ignore-eos", "--max-concurrency", "2"]
        )
    out = capsys.readouterr().out
    found = figures(out)
    prompts = sharegpt.sample_requests(2, seed=0, output_len=3)
    assert found["Successful requests:"] == [2] and found["Total generated tokens:"] == [6]
    assert found["Total input tokens:"] == [sum(r.prompt_len for r in prompts)]  # the server counted the same tokens
    assert "2 sharegpt requests" in out and "mean max_tokens 3.0 (ignore_eos)" in out
