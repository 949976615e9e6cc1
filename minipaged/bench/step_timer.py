"""Where a step's time goes: schedule, prepare (packing + metadata), forward, sample, other.

:class:`StepTimer` subscribes to the engine's steps for the duration of a ``with`` block
(:meth:`LLM.subscribe <minipaged.engine.llm.LLM.subscribe>`) and adds up the seconds every
:class:`~minipaged.engine.step_output.StepOutput` carries: the engine times its own phases, so
nothing is patched. Inside the forward it also has ``attention`` (every layer's ``attend``: the
KV write and the attention itself), in ``seconds["attention"]``; the forward's rest is the
matrix products and the small ops around them. ``seconds["total"]`` is the whole step.
"""

from __future__ import annotations

from collections import defaultdict

from minipaged.engine.llm import LLM
from minipaged.engine.step_output import StepOutput

PHASES = ("schedule", "prepare", "forward", "sample")


class StepTimer:
    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0

    def record(self, out: StepOutput) -> None:
        """Add one step's seconds (the observer :meth:`__enter__` subscribes)."""
        self.steps += 1
        for phase in (*PHASES, "attention", "total"):
            self.seconds[phase] += out.seconds.get(phase, 0.0)

    def __enter__(self) -> StepTimer:
        self.llm.subscribe(self.record)
        return self

    def __exit__(self, *exc: object) -> None:
        self.llm.unsubscribe(self.record)

    def shares(self) -> dict[str, float]:
        """Each phase's share of the total; ``other`` is the rest (the update after the forward, bookkeeping)."""
        total = self.seconds["total"]  # the whole step: schedule, run, update
        out = {p: self.seconds[p] / total for p in PHASES}
        out["other"] = 1 - sum(out.values())
        return out
