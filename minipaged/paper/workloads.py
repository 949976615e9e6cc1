"""The paper's two workloads, as seeded traces with its mean lengths.

The PagedAttention paper (Kwon et al., SOSP'23, Fig. 11) serves two datasets: **ShareGPT**
(conversations: 161.31 prompt / 337.99 output tokens on average, long tails) and **Alpaca**
(instructions: 19.31 / 58.45). No dataset is downloaded here: :func:`paper_trace` draws
lognormal lengths (:func:`minipaged.sim.synthetic_trace`; the spread ``sigma`` is ours: the paper
shows histograms, not parameters), then scales them so that the trace's own means are the
paper's (a few hundred long-tailed draws can miss a mean by 10%, and every figure moves with
it). :func:`engine_requests` turns a trace into token-id prompts for the engine.

ShareGPT also runs on its **real lengths** (``"sharegpt-real"``: :mod:`minipaged.paper.sharegpt`,
the package index's copy of the file counted in the real model's tokens, sampled as vLLM's
serving benchmark samples it). Alpaca has no copy on the package index: it stays lognormal.
:func:`trace_for` gives any of the three by name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from minipaged.paper import sharegpt
from minipaged.sim import TraceRequest, synthetic_trace, token_ids_for
from minipaged.tiny import task

if TYPE_CHECKING:
    from typing_extensions import Unpack


class TraceOptions(TypedDict, total=False):
    """The keywords :func:`paper_trace` passes on to :func:`~minipaged.sim.synthetic_trace`."""

    arrival_rate: float
    shared_prefix_len: int
    num_prefixes: int


# The paper's systems: Orca with three reservation rules against vLLM's paged memory.
SYSTEM_LABELS = {"orca-max": "Orca (Max)", "orca-pow2": "Orca (Pow2)", "orca-oracle": "Orca (Oracle)", "paged": "paged"}
CALIBRATION_ROUNDS = 4
ALL_AT_ONCE = 1e9  # an arrival rate per step so high that every request arrives at step 0: a queue that never empties


@dataclass(frozen=True)
class TraceShape:
    """Mean prompt and output lengths (tokens) of a dataset, and the lognormal spread we give them."""

    name: str
    mean_prompt: float
    mean_output: float
    sigma: float


SHAREGPT = TraceShape("ShareGPT", 161.31, 337.99, sigma=1.0)
ALPACA = TraceShape("Alpaca", 19.31, 58.45, sigma=0.7)
SHAPES = {"sharegpt": SHAREGPT, "alpaca": ALPACA}


def paper_trace(
    shape: TraceShape, num_requests: int, seed: int = 0, max_len: int = 2048, **kw: Unpack[TraceOptions]
) -> list[TraceRequest]:
    """``num_requests`` requests of ``shape``, prompt + output <= ``max_len``, all arriving at step 0
    unless ``arrival_rate`` (per step) is given; other keywords go to :func:`synthetic_trace`."""
    kw.setdefault("arrival_rate", ALL_AT_ONCE)
    trace = synthetic_trace(
        num_requests,
        seed,
        mean_prompt=shape.mean_prompt,
        mean_output=shape.mean_output,
        max_len=max_len,
        sigma=shape.sigma,
        **kw,
    )
    for _ in range(CALIBRATION_ROUNDS):  # clipping to max_len moves the means again: a few rounds settle them
        _scale_means(trace, shape, max_len)
    return trace


TRACES = {  # the traces the simulated figures replay, by name
    "sharegpt": "ShareGPT-shaped (lognormal)",
    "sharegpt-real": "ShareGPT (real lengths)",
    "alpaca": "Alpaca-shaped (lognormal)",
}


def trace_for(name: str, num_requests: int, seed: int = 0, max_len: int = 2048) -> list[TraceRequest]:
    """The trace ``name`` (a key of :data:`TRACES`), all arriving at step 0, prompt + output <= ``max_len``."""
    if name == "sharegpt-real":
        return sharegpt.real_trace(num_requests, seed, max_len)
    if name not in SHAPES:
        raise ValueError(f"unknown trace {name!r}: choose from {', '.join(TRACES)}")
    return paper_trace(SHAPES[name], num_requests, seed, max_len)


def _scale_means(trace: list[TraceRequest], shape: TraceShape, max_len: int) -> None:
    """Scale every prompt's own part (past a shared prefix) and every output so their means are ``shape``'s."""
    prompt_scale = shape.mean_prompt / (sum(r.prompt_len - r.prefix_len for r in trace) / len(trace))
    output_scale = shape.mean_output / (sum(r.output_len for r in trace) / len(trace))
    for r in trace:
        own_len = max(1, round((r.prompt_len - r.prefix_len) * prompt_scale))
        r.prompt_len = min(r.prefix_len + own_len, max_len - 1)
        r.output_len = min(max(1, round(r.output_len * output_scale)), max_len - r.prompt_len)


WorkItem = tuple[list[int], int]  # (prompt token ids, output tokens): what the engine is asked


def engine_requests(trace: list[TraceRequest], vocab_size: int, seed: int = 0) -> list[WorkItem]:
    """The trace as (prompt ids, max_tokens) pairs; shared prefixes share their ids."""
    return [(token_ids_for(r, vocab_size, seed), r.output_len) for r in trace]


def mean_lengths(trace: list[TraceRequest]) -> dict[str, float]:
    """The trace's own mean prompt and output lengths (clipping to ``max_len`` moves them a little)."""
    n = max(len(trace), 1)
    return {"prompt": sum(r.prompt_len for r in trace) / n, "output": sum(r.output_len for r in trace) / n}


def copy_workload(n: int, seed: int) -> list[tuple[str, int]]:
    """``n`` copy prompts for the embedded model (preambles of 40-400 characters), 20-200 output tokens each."""
    rng = random.Random(seed)
    return [
        (task.prompt_for(task.random_text(rng), task.random_preamble(rng, 40, 400)), rng.randint(20, 200))
        for _ in range(n)
    ]
