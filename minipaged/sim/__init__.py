"""Simulation without a model: seeded request traces (:mod:`.traces`) and the memory-only
replay of stages 0-2 (:mod:`.replay`), as per-step series or as the memory's state step by step
(:mod:`.states`)."""

from minipaged.sim.replay import (
    ContiguousReplay,
    ContiguousState,
    PagedReplay,
    PagedState,
    next_power_of_two,
    replay,
    replay_steps,
    simulate_contiguous_vs_paged,
)
from minipaged.sim.traces import TraceRequest, synthetic_trace, token_ids_for

__all__ = [
    "ContiguousReplay",
    "ContiguousState",
    "PagedReplay",
    "PagedState",
    "TraceRequest",
    "next_power_of_two",
    "replay",
    "replay_steps",
    "simulate_contiguous_vs_paged",
    "synthetic_trace",
    "token_ids_for",
]
