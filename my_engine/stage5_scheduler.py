"""Stage 5 (notebook 05): the KV door and a continuous-batching scheduler.

vLLM's shape: a ``Scheduler`` decides each step which requests compute how many tokens, and asks
one door, the ``KVCacheManager``, for memory: ``get_computed_blocks`` (stage 6's prefix hits),
``allocate_slots`` (blocks for the new tokens, or ``None``) and ``free``. The scheduler never
looks at blocks itself. ``update_from_output`` (given) moves the requests on after the step runs.
Check: the last cell of notebook 05, or ``python -m exercises my_engine 5``; the checks drive your
scheduler over a workload step by step and compare each step with the reference's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int = 16
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return len(self.output_token_ids) >= self.max_tokens


@dataclass
class SchedulerOutput:
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)


class KVCacheManager:
    def __init__(self, pool: Any, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.req_to_blocks: dict[str, list[Any]] = {}

    def get_computed_blocks(self, request: Request) -> tuple[list[Any], int]:
        return [], 0

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[Any] = ()
    ) -> list[Any] | None:
        """**core** — blocks for ``num_new_tokens`` more tokens of ``request``; ``None`` when too few are free.

        The request will hold ``request.num_computed_tokens + len(new_computed_blocks) * block_size +
        num_new_tokens`` tokens. ``new_computed_blocks`` are prefix hits (stage 6; empty until then): they
        join its blocks after ``pool.touch``. Take ``cdiv(total, block_size)`` minus what it holds
        from the pool, or, when not enough are free, take nothing and return ``None``. Record the
        request's blocks in ``req_to_blocks`` and return the newly allocated ones. (Stage 6: a hit
        whose ``ref_cnt`` is 0 waits in the free queue, and touching it takes it from there: count
        it among the blocks the request needs free, as vLLM's ``num_evictable_computed_blocks``.)"""
        raise NotImplementedError("KVCacheManager.allocate_slots: the missing blocks, or None (taking nothing)")

    def free(self, request: Request) -> None:
        """**core** — give all of ``request``'s blocks back to the pool (in logical order) and forget them."""
        raise NotImplementedError("KVCacheManager.free: pool.free(its blocks), then drop its entry")


class Scheduler:
    def __init__(self, kv_cache_manager: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        """**core** — decide one step; return a ``SchedulerOutput``.

        The step computes at most ``max_num_batched_tokens`` tokens (the budget) for at most
        ``max_num_seqs`` running requests.

        1. **Continuous batching.** Running requests first, oldest first, while the budget is not 0:
           each asks for ``n = min(its missing tokens, budget left)`` (missing: ``num_tokens -
           num_computed_tokens``). While ``allocate_slots`` returns ``None``, **preempt** the newest
           running request (the last of ``running``): free its blocks, set its
           ``num_computed_tokens`` to 0 (it is recomputed later: its tokens are kept), put it at the
           FRONT of ``waiting``, and name it in ``preempted``. If the victim is the request asking,
           it gets nothing this step. Otherwise it is scheduled with ``n``, which leaves the budget.
        2. **Admission**, only if nobody was preempted: waiting requests, front first, while the budget
           is not 0 and fewer than ``max_num_seqs`` run. ``get_computed_blocks`` gives its prefix hits
           (none before stage 6); it asks for ``n = min(missing tokens after the hits, budget left)``;
           if ``allocate_slots(request, n, hits)`` is ``None``, stop (first come, first served).
           Admitted: its ``num_computed_tokens`` grows by the hit tokens; it moves to ``running``.

        **stretch — chunked prefill**: the ``min(..., budget left)`` above. A core version may give
        every prompt all its tokens and stop admitting when a prompt does not fit the budget; the
        stretch check runs with a budget of 16 tokens, smaller than most prompts."""
        raise NotImplementedError(
            "Scheduler.schedule: running first (preempt the newest when blocks run out), then admit waiting"
        )

    def update_from_output(self, output: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """Given: the step ran. Advance every scheduled request; append the tokens sampled for those
        that reached their end; free the finished ones (returned)."""
        finished = []
        for request in list(self.running):
            n = output.num_scheduled_tokens.get(request.request_id)
            if n is None:
                continue
            request.num_computed_tokens += n
            if request.num_computed_tokens == request.num_tokens:
                request.output_token_ids.append(sampled[request.request_id])
                if request.is_finished:
                    self.running.remove(request)
                    self.kv_cache_manager.free(request)
                    finished.append(request)
        return finished
