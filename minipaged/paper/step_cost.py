"""A step's cost, fitted to measured runs: ``seconds = F + m x decode rows + p x prefill tokens``
(:class:`StepCost`, least squares over every step of the runs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minipaged.paper.engine_run import EngineRun


@dataclass
class StepCost:
    """``seconds = per_step + per_decode x decode rows + per_prefill x prefill tokens`` for one step."""

    per_step: float
    per_decode: float
    per_prefill: float

    @classmethod
    def fit(cls, runs: list[EngineRun]) -> StepCost:
        """Least squares over every step of ``runs``."""
        x = torch.tensor([[1.0, d, p] for r in runs for _, d, p in r.steps], dtype=torch.float64)
        y = torch.tensor([[t] for r in runs for t, _, _ in r.steps], dtype=torch.float64)
        return cls(*torch.linalg.lstsq(x, y).solution.flatten().tolist())

    def seconds(self, steps: int, decode_rows: int, prefill_tokens: int) -> float:
        return self.per_step * steps + self.per_decode * decode_rows + self.per_prefill * prefill_tokens
