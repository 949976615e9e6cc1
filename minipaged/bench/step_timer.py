"""Where a step's time goes: schedule, prepare (packing + metadata), forward, sample, other.

:class:`StepTimer` wraps the engine's phases for the duration of a ``with`` block and puts them
back afterwards, so the engine itself carries no timing code. Inside the forward it also times
``attention`` (every layer's ``attend``: the KV write and the attention itself), in
``seconds["attention"]``; the forward's rest is the matrix products and the small ops around them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from minipaged import LLM

PHASES = ("schedule", "prepare", "forward", "sample")


class StepTimer:
    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.seconds: dict[str, float] = defaultdict(float)
        self._saved: list[tuple[object, str, object]] = []

    def _wrap(self, owner: object, attr: str, phase: str) -> None:
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start

        self._saved.append((owner, attr, original))
        setattr(owner, attr, timed)

    def __enter__(self) -> StepTimer:
        llm = self.llm
        self._wrap(llm.scheduler, "schedule", "schedule")
        self._wrap(llm.runner, "prepare", "prepare")
        self._wrap(llm.model, "forward", "forward")
        self._wrap(llm.runner, "sample", "sample")
        self._wrap(llm.runner.attn, "attend", "attention")  # inside forward: not one of PHASES
        self._wrap(llm, "run_step", "total")
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, _ in reversed(self._saved):
            delattr(owner, attr)  # the instance attribute hid the class's method

    def shares(self) -> dict[str, float]:
        """Each phase's share of the total; ``other`` is the rest (postprocess, bookkeeping)."""
        total = self.seconds["total"]  # the whole step: schedule, run, postprocess
        out = {p: self.seconds[p] / total for p in PHASES}
        out["other"] = 1 - sum(out.values())
        return out
