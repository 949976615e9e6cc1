"""``GET /metrics``: the engine's figures in Prometheus' text format, as vLLM exposes its own.

Read at scrape time from what the engine thread last published (at most ``FRAME_INTERVAL``
old while the engine runs, exact once it is idle). Names follow vLLM's (``vllm:num_requests_running``
here is ``minipaged:num_requests_running``), so a dashboard built for one reads the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

GAUGES = {
    "num_requests_running": "requests the engine is running",
    "num_requests_waiting": "requests waiting for a place in the batch or for KV blocks",
    "num_free_blocks": "KV blocks free (cached-but-free blocks included)",
    "num_blocks": "KV blocks in the pool",
    "cached_blocks": "blocks that hold a cached prefix",
    "tokens_held": "KV slots holding a live token",
    "slots_allocated": "KV slots allocated",
}
COUNTERS = {
    "prefix_hit_tokens": "prompt tokens served from the prefix cache",
    "resumed_hit_tokens": "tokens a preempted request found again in the prefix cache when resumed",
    "prefill_tokens_computed": "prompt tokens computed (recomputation after preemption included)",
    "num_preemptions": "sequences preempted for lack of KV blocks",
    "cow_copies": "blocks copied on write",
    "evictions": "cached blocks evicted (reused for other tokens)",
    "prompt_tokens": "prompt tokens received",
    "generation_tokens": "tokens generated",
    "requests_finished": "requests that finished",
    "requests_aborted": "requests aborted (their client left)",
    "requests_failed": "requests failed by an engine error",
    "failed_steps": "engine steps that raised",
}


class EngineCollector:
    """A prometheus_client collector over ``stats()``, the engine thread's last published figures."""

    def __init__(self, stats: Callable[[], dict]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        for name, help_text in GAUGES.items():
            if name in s:
                yield GaugeMetricFamily(f"minipaged:{name}", help_text, value=s[name])
        for name, help_text in COUNTERS.items():
            if name in s:
                yield CounterMetricFamily(f"minipaged:{name}", help_text, value=s[name])


def registry(stats: Callable[[], dict]) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(EngineCollector(stats))
    return reg


def render(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
