"""One engine run over a workload, measured as ``generate`` runs it (:class:`EngineRun`), and
the fair way to compare runs on a shared machine (:func:`fastest_of`).

:func:`run_engine` submits every request at once and steps the engine until done, reading what
each step hands back (its :class:`~minipaged.engine.step_output.StepOutput`: the rows it ran,
the sequences left running) and, when asked, the pool's figures after it (``kv_stats()``).
The paper's measured figures and the benchmarks (:mod:`minipaged.bench.engine`,
:mod:`minipaged.bench.chat`) share it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from minipaged.engine.llm import LLM
from minipaged.engine.sampling_params import SamplingParams

WorkItem = tuple[list[int] | str, int]  # (prompt, output length)


@dataclass
class EngineRun:
    """What one engine did with a workload; series are per step."""

    name: str
    seconds: float = 0.0
    output_tokens: int = 0
    tokens: list[list[int]] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)  # kv_stats() after each step, when recorded
    preemptions: int = 0
    steps: list[tuple[float, int, int]] = field(default_factory=list)  # (seconds, decode rows, prefill tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def utilization(self) -> float:
        """Slots holding a live token over slots allocated, summed over steps."""
        held = sum(d["tokens_held"] for d in self.stats)
        return held / max(1, sum(d["slots_allocated"] for d in self.stats))


def run_engine(llm: LLM, name: str, requests: Sequence[WorkItem], record: bool = False) -> EngineRun:
    """Submit every request at once and step until done, timing each step as ``generate`` runs
    it (no snapshot); with ``record``, read the pool's figures after every step, untimed."""
    run = EngineRun(name)
    preempted_before = llm.kv_stats()["num_preemptions"]  # the engine may have served this workload already
    ids = [llm.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)) for p, n in requests]
    with tqdm(total=len(requests), desc=name, leave=False) as bar:
        while llm.has_unfinished_requests():
            start = time.perf_counter()
            out = llm.engine_step(outputs=False)
            seconds = time.perf_counter() - start
            batch = out.scheduler_output
            decodes = sum(1 for n in batch.q_lens if n == 1)
            run.steps.append((seconds, decodes, sum(batch.q_lens) - decodes))
            if record:
                run.stats.append(llm.kv_stats())
            run.running.append(out.num_running)
            bar.update(len(out.finished))
    run.seconds = sum(t for t, _, _ in run.steps)
    run.output_tokens = sum(n for _, n in requests)
    run.tokens = [llm.get_output(i).outputs[0].token_ids for i in ids]
    run.preemptions = llm.kv_stats()["num_preemptions"] - preempted_before
    return run


def fastest_of(runners: list[Callable[[], EngineRun]], repeats: int) -> list[EngineRun]:
    """Run each runner ``repeats`` times, taking turns, and keep each one's fastest run.

    Times on a shared machine swing by tens of percent between runs. Taking turns exposes every
    runner to the same disturbances, and the fastest run is the least disturbed one.
    """
    best: dict[int, EngineRun] = {}  # runner's index -> its fastest run so far
    for _ in range(repeats):
        for i, runner in enumerate(runners):
            run = runner()
            if i not in best or run.seconds < best[i].seconds:
                best[i] = run
    return [best[i] for i in range(len(runners))]
