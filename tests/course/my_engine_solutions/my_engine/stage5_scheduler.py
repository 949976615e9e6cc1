"""Stage 5 (notebook 05): a KV door and a continuous-batching scheduler."""

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
        blocks = self.req_to_blocks.get(request.request_id, [])
        hits = list(new_computed_blocks)
        total = request.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        needed = -(-total // self.block_size) - len(blocks) - len(hits)
        revived = sum(1 for block in hits if block.ref_cnt == 0)  # a free cached hit leaves the free queue
        if max(needed, 0) + revived > self.pool.num_free_blocks:
            return None
        for block in hits:
            self.pool.touch(block)
        new = self.pool.allocate(max(needed, 0))
        self.req_to_blocks[request.request_id] = blocks + hits + new
        return new

    def free(self, request: Request) -> None:
        self.pool.free(self.req_to_blocks.pop(request.request_id, []))


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
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        kv = self.kv_cache_manager
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            while kv.allocate_slots(request, n) is None:
                victim = self.running.pop()
                kv.free(victim)
                victim.num_computed_tokens = 0
                self.waiting.appendleft(victim)
                out.preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                out.num_scheduled_tokens[request.request_id] = n
                budget -= n
                i += 1
        if out.preempted:
            return out
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            hits, num_hit_tokens = kv.get_computed_blocks(request)
            n = min(request.num_tokens - request.num_computed_tokens - num_hit_tokens, budget)
            if kv.allocate_slots(request, n, hits) is None:
                break
            request.num_computed_tokens += num_hit_tokens
            self.waiting.popleft()
            self.running.append(request)
            out.num_scheduled_tokens[request.request_id] = n
            budget -= n
        return out

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
