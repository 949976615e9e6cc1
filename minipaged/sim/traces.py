"""Seeded synthetic request traces: what the benches and the memory replay feed on.

Lengths of real prompts and outputs are long-tailed: most are short, a few are very long.
Lognormal lengths reproduce that, arrivals follow a Poisson process, and a trace is a plain
list of :class:`TraceRequest` that the same seed always rebuilds.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass
class TraceRequest:
    """A request arriving at step ``arrival``; its first ``prefix_len`` prompt tokens are the shared
    prefix ``prefix_id`` (None: no shared prefix)."""

    request_id: int
    arrival: int
    prompt_len: int
    output_len: int
    prefix_id: int | None = None
    prefix_len: int = 0

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    # mu chosen so that the distribution's mean (before clipping) is ``mean``.
    return rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)


def synthetic_trace(
    num_requests: int,
    seed: int,
    mean_prompt: float = 256.0,
    mean_output: float = 128.0,
    max_len: int = 2048,
    arrival_rate: float = 1.0,
    shared_prefix_len: int = 0,
    num_prefixes: int = 0,
    sigma: float = 1.0,
) -> list[TraceRequest]:
    """``num_requests`` requests with lognormal lengths, arriving ``arrival_rate`` per step on average.

    ``prompt_len + output_len <= max_len`` always (the model's context). With ``num_prefixes > 0``
    each prompt starts with one of ``num_prefixes`` shared prefixes of ``shared_prefix_len``
    tokens (a system prompt), chosen uniformly, followed by its own lognormal part.
    """
    if (shared_prefix_len > 0) != (num_prefixes > 0):
        raise ValueError("shared_prefix_len and num_prefixes must both be 0 or both be positive")
    if shared_prefix_len >= max_len - 1:
        raise ValueError(f"shared_prefix_len ({shared_prefix_len}) leaves no room in max_len ({max_len})")
    rng = random.Random(seed)
    requests, clock = [], 0.0
    for request_id in range(num_requests):
        clock += rng.expovariate(arrival_rate)  # Poisson process: exponential gaps
        prefix_id = rng.randrange(num_prefixes) if num_prefixes else None
        prompt = shared_prefix_len + max(1, round(_lognormal(rng, mean_prompt, sigma)))
        prompt = min(prompt, max_len - 1)  # leave room for at least one output token
        output = min(max(1, round(_lognormal(rng, mean_output, sigma))), max_len - prompt)
        requests.append(TraceRequest(request_id, int(clock), prompt, output, prefix_id, shared_prefix_len))
    return requests


def token_ids_for(request: TraceRequest, vocab_size: int, seed: int) -> list[int]:
    """The prompt's token ids, deterministic in (request, seed).

    Requests with the same ``prefix_id`` share their first ``prefix_len`` ids; the rest is each request's own.
    """
    # String seeds are hashed with SHA-512 by ``random``, so they do not depend on PYTHONHASHSEED.
    prefix: list[int] = []
    if request.prefix_id is not None:
        prefix_rng = random.Random(f"{seed}/prefix/{request.prefix_id}")
        prefix = [prefix_rng.randrange(vocab_size) for _ in range(request.prefix_len)]
    own_rng = random.Random(f"{seed}/request/{request.request_id}")
    return prefix + [own_rng.randrange(vocab_size) for _ in range(request.prompt_len - len(prefix))]
