"""The measured figures' common ground: the paper's systems as engines, one KV budget, and the runs.

- :func:`make_llm` builds Orca (Max / Pow2 / Oracle) as the contiguous layout with a reservation
  rule, and vLLM as the paged layout, all on the same model and the same KV memory (:data:`BUDGET`:
  64 blocks of 16 slots, ``max_model_len`` 512: an Orca (Max) reservation is half the pool).
- :func:`serve_at_rate` serves requests arriving as a Poisson process on a clock that advances
  by each step's measured time, and jumps over idle gaps (no sleeping): a server's latencies,
  measured, in the time the engine actually worked.
- :class:`StepRecorder` keeps ``kv_stats()`` at every engine step's fullest, whoever drives the steps
  (``generate``, ``beam_search``), without timing code in the engine.
"""

from __future__ import annotations

import random
import time
from typing import Any

from minipaged.engine.llm import LLM
from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.step_output import StepOutput
from minipaged.model.config import ModelConfig
from minipaged.model.loader import EMBEDDED_MODEL_DIR
from minipaged.model.random_models import is_random_model, random_model_config
from minipaged.paper.workloads import WorkItem

MODEL = "random:smollm2-135m"  # bandwidth-bound on a CPU, like a GPU's serving regime (docs/paper.md)
BUDGET = dict(num_kvcache_blocks=64, block_size=16, max_model_len=512)
RESERVE_RULES = {"orca-max": "max", "orca-pow2": "pow2", "orca-oracle": "oracle", "paged": None}


def make_llm(system: str, model: str | None = MODEL, **kw: Any) -> LLM:
    """The engine for ``system`` (a key of :data:`RESERVE_RULES`); ``kw`` go to :class:`LLM`."""
    reserve = RESERVE_RULES[system]
    if reserve is None:
        return LLM(model, **kw)
    return LLM(model, kv_layout="contiguous", contiguous_reserve=reserve, **kw)


def vocab_size(model: str | None) -> int:
    """The vocabulary of ``model`` (a ``random:`` name, a folder, or None: the embedded model), read from its config."""
    if is_random_model(model):
        return random_model_config(model).vocab_size
    return ModelConfig.from_folder(EMBEDDED_MODEL_DIR if model is None else model).vocab_size


def greedy(max_tokens: int) -> SamplingParams:
    """Every figure's requests: greedy, exactly ``max_tokens`` tokens (the trace fixes output lengths)."""
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def warm_up(llm: LLM) -> None:
    """One short request, so that first-call costs (allocations, lazy imports) are not timed."""
    vocab = llm.model.config.vocab_size
    llm.generate([[i % vocab for i in range(1, 9)]], greedy(2), use_tqdm=False)


def serve_at_rate(llm: LLM, requests: list[WorkItem], rate: float, seed: int = 0) -> dict:
    """Serve ``requests`` arriving at ``rate`` per second (Poisson); returns latencies in seconds.

    The clock advances by each :meth:`LLM.step`'s measured time; when nothing runs it jumps to
    the next arrival. Returns ``{"normalized_latency": mean over requests of (finish - arrival) /
    output tokens, "latencies": [...], "tokens": each request's output token ids, "seconds": the
    clock at the end, "busy_seconds": time spent in steps}``.
    """
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in requests:
        t += rng.expovariate(rate)
        arrivals.append(t)
    clock, busy, nxt = 0.0, 0.0, 0
    arrived: dict[int, tuple[float, int]] = {}  # request id -> (arrival, output tokens)
    finished: dict[int, float] = {}
    while nxt < len(requests) or llm.has_unfinished_requests():
        if not llm.has_unfinished_requests():
            clock = max(clock, arrivals[nxt])  # idle: nothing to do until the next request
        while nxt < len(requests) and arrivals[nxt] <= clock:
            prompt, n = requests[nxt]
            arrived[llm.add_request(prompt, greedy(n))] = (arrivals[nxt], n)
            nxt += 1
        start = time.perf_counter()
        outputs = llm.step()
        spent = time.perf_counter() - start
        clock, busy = clock + spent, busy + spent
        finished.update((out.request_id, clock) for out in outputs if out.finished)
    latencies = [(finished[rid] - at) / n for rid, (at, n) in arrived.items()]
    return {
        "normalized_latency": sum(latencies) / len(latencies),
        "latencies": latencies,
        "tokens": [llm.get_output(rid).outputs[0].token_ids for rid in arrived],
        "seconds": clock,
        "busy_seconds": busy,
    }


def saturated_rate(llm: LLM, requests: list[WorkItem], window: int | None = None) -> dict:
    """The rate ``llm`` serves requests while a queue waits: the highest arrival rate it sustains.

    Every request is queued at once and the engine steps while any still waits, so every timed
    step runs as full as the system allows; the rest are then aborted (draining the last few
    requests, the longest of them running nearly alone, measures the trace's longest request,
    not the system). Output tokens per second of those steps, over the workload's mean output
    length, is requests per second. ``window`` stops the timing once that many requests' worth
    of output tokens (at the mean length) were generated, so that a slow system is timed on the
    same work as a fast one, not for longer. Returns ``{"rate", "tokens_per_s", "mean_running", "steps",
    "finished": {index in requests: output token ids} of the requests that finished}``; the
    engine is empty again afterwards.
    """
    ids = [llm.add_request(prompt, greedy(n)) for prompt, n in requests]
    mean_output = sum(n for _, n in requests) / len(requests)
    enough = mean_output * (window or len(requests))
    seconds, tokens, running, finished = 0.0, 0, [], {}
    waiting = llm.kv_stats()["num_waiting"]
    while waiting and tokens < enough:
        start = time.perf_counter()
        out = llm.engine_step(outputs=False)
        seconds += time.perf_counter() - start
        tokens += out.num_sampled
        running.append(out.num_running)
        waiting = out.num_waiting
        finished.update({r: llm.get_output(r).outputs[0].token_ids for r in out.finished})
    llm.abort_request(ids)
    return {
        "rate": tokens / seconds / mean_output,
        "tokens_per_s": tokens / seconds,
        "mean_running": sum(running) / len(running),
        "steps": len(running),
        "finished": {ids.index(rid): out for rid, out in finished.items()},
    }


class StepRecorder:
    """``with StepRecorder(llm) as rec: llm.generate(...)``: ``rec.stats`` holds ``kv_stats()`` after each step.

    It subscribes to the engine's steps (:meth:`LLM.subscribe`) for the duration of the block and
    keeps each step's ``kv_stats_at_peak`` (taken once the step's K/V are written, before anything
    is freed), so the engine carries no recording code.
    """

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.stats: list[dict] = []

    def record(self, out: StepOutput) -> None:
        assert out.kv_stats_at_peak is not None  # filled while an observer is subscribed
        self.stats.append(out.kv_stats_at_peak)

    def __enter__(self) -> StepRecorder:
        self.llm.subscribe(self.record)
        return self

    def __exit__(self, *exc: object) -> None:
        self.llm.unsubscribe(self.record)
