"""Fig. 12: latency against request rate, and the highest rate each system sustains (measured).

The paper serves OPT-13B on an A100 with requests arriving as a Poisson process, and plots the
**normalized latency** (a request's end-to-end time divided by its output tokens, averaged)
against the rate: flat while the server keeps up, then a wall. vLLM's wall stands at 1.7-2.7x
the rate of Orca (Oracle) and 2.7-8x that of Orca (Max), because more requests fit in memory.

Here the real engine serves ``random:smollm2-135m`` (bandwidth-bound on a CPU, as the paper's
model is on a GPU) with Alpaca-shaped requests, all four systems on one KV budget. Two
measurements:

1. **Capacity**: every request queued at once, the engine timed while some still wait
   (:func:`~minipaged.paper.engines.saturated_rate`): the rate it serves requests when full. A
   rate above it grows the queue without bound: it is the highest rate the system sustains.
2. **The curve**: requests arriving at rates spread up to the paged system's capacity
   (:func:`~minipaged.paper.engines.serve_at_rate`: a clock that advances by each step's measured
   time). Each system stops after its first rate above its own capacity: beyond it the latency
   only grows with the number of requests.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from minipaged.paper.engines import (
    BUDGET,
    MODEL,
    RESERVE_RULES,
    make_llm,
    saturated_rate,
    serve_at_rate,
    vocab_size,
    warm_up,
)
from minipaged.paper.report import PaperResult
from minipaged.paper.workloads import ALPACA, SYSTEM_LABELS, engine_requests, paper_trace

PAPER = {"paged_over_oracle": "1.7-2.7x", "paged_over_max": "2.7-8x"}
RATE_FRACTIONS = (0.25, 0.5, 1.0)  # of the paged system's capacity


def alpaca_requests(num_requests: int, vocab_size: int, seed: int = 0, max_output: int | None = None) -> list:
    """Alpaca-shaped (prompt ids, output tokens) within ``BUDGET``'s ``max_model_len``; ``max_output`` caps outputs."""
    trace = paper_trace(ALPACA, num_requests, seed, max_len=BUDGET["max_model_len"])
    return [(ids, min(n, max_output or n)) for ids, n in engine_requests(trace, vocab_size, seed)]


def latency_vs_rate(
    capacity_requests: int = 48,
    capacity_window: int = 16,
    curve_requests: int = 10,
    rate_fractions: tuple[float, ...] = RATE_FRACTIONS,
    max_output: int | None = None,
    model: str | None = MODEL,
    seed: int = 0,
    quick: bool = False,
) -> PaperResult:
    title = "Fig. 12: normalized latency against request rate (Alpaca-shaped)"
    res = PaperResult("fig12", title, "measured", quick=quick)
    res.settings = {
        "model": model,
        **BUDGET,
        "capacity_requests": capacity_requests,
        "capacity_window": capacity_window,
        "curve_requests": curve_requests,
        "max_output": max_output,
        "seed": seed,
    }
    engines = {system: make_llm(system, model, **BUDGET) for system in RESERVE_RULES}
    vocab = vocab_size(model)
    capacity_work = alpaca_requests(capacity_requests, vocab, seed, max_output)
    curve_work = alpaca_requests(curve_requests, vocab, seed + 1, max_output)
    capacity = {}
    for system, llm in tqdm(engines.items(), desc="fig12 capacity", leave=False):
        warm_up(llm)
        full = saturated_rate(llm, capacity_work, capacity_window)
        capacity[system] = full["rate"]
        res.data.setdefault("mean_running", {})[system] = full["mean_running"]
    rates = [f * capacity["paged"] for f in rate_fractions]
    curves: dict[str, list[dict]] = {}
    tokens: dict[str, list[list[int]]] = {}  # each system's tokens at the first rate
    for system, llm in tqdm(engines.items(), desc="fig12 curves", leave=False):
        curves[system] = []
        for rate in rates:
            served = serve_at_rate(llm, curve_work, rate, seed)
            tokens.setdefault(system, served["tokens"])
            curves[system].append({"rate": rate, "normalized_latency": served["normalized_latency"]})
            if rate > capacity[system]:
                break  # past its wall: more rates only lengthen the queue
    res.data.update(capacity=capacity, curves=curves, rates=rates)
    for system, value in capacity.items():
        res.add(f"{SYSTEM_LABELS[system]}, capacity", value, unit="req/s")
    for system, paper in (("orca-oracle", PAPER["paged_over_oracle"]), ("orca-max", PAPER["paged_over_max"])):
        if system in capacity:
            res.add(
                f"paged / {SYSTEM_LABELS[system]}, sustained rate", capacity["paged"] / capacity[system], paper, "x"
            )
    same = all(tokens[s] == tokens["paged"] for s in tokens)
    res.data["tokens_identical"] = same
    res.notes.append(f"every system generated the same tokens: {same}")
    res.notes.append(
        "capacity: all requests queued at once, output tokens per second of engine time while some "
        "still wait, over the mean output length; the curve's latencies are in data['curves']"
    )
    return res
