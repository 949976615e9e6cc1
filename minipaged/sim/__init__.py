"""Simulation without a model: seeded request traces (:mod:`.traces`) and the memory-only
replay of stages 0-2 (:mod:`.replay`)."""

from minipaged.sim.replay import simulate_contiguous_vs_paged
from minipaged.sim.traces import Request, synthetic_trace, token_ids_for

__all__ = ["Request", "simulate_contiguous_vs_paged", "synthetic_trace", "token_ids_for"]
