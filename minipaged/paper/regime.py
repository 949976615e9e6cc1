"""The throughput regime: why one engine gives 1.6x on one model and 3x+ on another (measured).

Paging lets more sequences run at once on the same KV memory. Whether that buys throughput
depends on what a step costs as it gets more rows (decode sequences):

- the embedded 2M-parameter model fits in this CPU's caches: each row's arithmetic is most of
  a step (**compute-bound**), so 4x the rows is nearly 4x the step time, and paging's bigger
  batches buy little;
- ``random:smollm2-135m`` (538 MB of fp32 weights, more than the caches) reads every weight once
  per step whatever the rows (**bandwidth-bound**, like any model serving on a GPU): 16 rows
  cost little more than 1, so paging's bigger batches are nearly free tokens.

Measured here: paged against contiguous (Orca (Max)) tokens/s on both models on one budget
each, tokens compared; and the decode step's time against its rows for both (a CPU roofline:
tokens/s = rows / step time).
"""

from __future__ import annotations

import time
from typing import Any

from tqdm.auto import tqdm

from minipaged.engine.llm import LLM
from minipaged.paper.engine_run import fastest_of, run_engine
from minipaged.paper.engines import BUDGET, MODEL, greedy, make_llm, vocab_size
from minipaged.paper.report import PaperResult
from minipaged.paper.serving import alpaca_requests
from minipaged.paper.step_cost import StepCost
from minipaged.paper.workloads import copy_workload

EMBEDDED_BUDGET = dict(num_kvcache_blocks=256, block_size=16, max_num_seqs=64)  # bench engine (c)
PAPER = "2-4x"  # §6.2: vLLM's throughput over the state of the art (FasterTransformer, Orca)


def decode_step_cost(llm: LLM, rows: list[int], decode_steps: int, prompt_len: int = 16) -> dict[int, float]:
    """Seconds of one decode step with ``r`` running sequences, for each ``r`` in ``rows`` (the fastest of
    ``decode_steps`` steps, after one prefill step); ``llm`` needs ``max_num_seqs >= max(rows)``."""
    vocab = llm.model.config.vocab_size
    cost = {}
    for r in rows:
        for i in range(r):
            llm.add_request([(7 * i + j) % vocab for j in range(prompt_len)], greedy(decode_steps + 1))
        llm.step()  # the prefill of all of them
        times = []
        while llm.has_unfinished_requests():
            start = time.perf_counter()
            llm.step()
            times.append(time.perf_counter() - start)
        cost[r] = min(times)
    return cost


def _compare(model: str | None, requests: list, repeats: int, **budget: Any) -> dict:
    """Paged and contiguous (Max) on ``requests``: tokens/s, their ratio, the fitted step cost."""
    paged, contiguous = make_llm("paged", model, **budget), make_llm("orca-max", model, **budget)
    runs = fastest_of(
        [lambda: run_engine(paged, "paged", requests), lambda: run_engine(contiguous, "contiguous", requests)],
        repeats,
    )
    cost = StepCost.fit(runs)
    return {
        "tokens_per_s": {r.name: r.tokens_per_s for r in runs},
        "seconds": {r.name: r.seconds for r in runs},
        "steps": {r.name: len(r.steps) for r in runs},
        "mean_running": {r.name: sum(r.running) / len(r.running) for r in runs},
        "preemptions": {r.name: r.preemptions for r in runs},
        "ratio": runs[1].seconds / runs[0].seconds,  # contiguous time / paged time
        "tokens_identical": runs[0].tokens == runs[1].tokens,
        "step_cost": {"per_step": cost.per_step, "per_decode": cost.per_decode, "per_prefill": cost.per_prefill},
    }


def throughput_regime(
    num_requests: int = 24,
    repeats: int = 1,
    rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    decode_steps: int = 4,
    max_output: int | None = None,
    quick: bool = False,
) -> PaperResult:
    title = "Throughput regime: paged / contiguous on a compute- and a bandwidth-bound model"
    res = PaperResult("regime", title, "measured", quick=quick)
    res.settings = {
        "requests": num_requests,
        "repeats": repeats,
        "embedded_budget": EMBEDDED_BUDGET,
        "smollm2_budget": BUDGET,
        "max_output": max_output,
    }
    work = {
        "embedded": (None, [(p, min(n, max_output or n)) for p, n in copy_workload(num_requests, 0)], EMBEDDED_BUDGET),
        "smollm2": (MODEL, None, BUDGET),
    }
    for key, (model, requests, budget) in tqdm(work.items(), desc="regime", leave=False):
        if requests is None:
            requests = alpaca_requests(num_requests, vocab_size(model), 0, max_output)
        res.data[key] = _compare(model, requests, repeats, **budget)
        probe = LLM(model, max_num_seqs=max(rows), num_kvcache_blocks=max(rows) * 4, max_model_len=64)
        step = decode_step_cost(probe, list(rows), decode_steps)
        res.data[key]["decode_step_seconds"] = {str(r): s for r, s in step.items()}
        res.data[key]["decode_tokens_per_s"] = {str(r): r / s for r, s in step.items()}
    labels = {"embedded": "embedded tiny model (copy prompts)", "smollm2": f"{MODEL} (Alpaca-shaped)"}
    for key, d in res.data.items():
        paper = PAPER if key == "smollm2" else None
        res.add(f"{labels[key]}: contiguous time / paged time", d["ratio"], paper, "x")
    lo, hi = str(min(rows)), str(max(rows))
    for key, d in res.data.items():
        growth = d["decode_step_seconds"][hi] / d["decode_step_seconds"][lo]
        res.add(f"{key}: decode step at {hi} rows / at {lo} row", growth, unit="x")
    for key, d in res.data.items():
        c = d["step_cost"]
        res.notes.append(
            f"{key}: step = {1e3 * c['per_step']:.1f} ms + {1e3 * c['per_decode']:.2f} ms per decode row + "
            f"{1e3 * c['per_prefill']:.2f} ms per prefill token; contiguous steps / paged steps "
            f"{d['steps']['contiguous'] / d['steps']['paged']:.2f}x; tokens identical: {d['tokens_identical']}"
        )
    return res
