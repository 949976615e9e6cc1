"""A memory-only replay of stage 0 against stages 1-2: the same trace, two memory systems.

No model runs: each running request grows by one token per step, so what is compared is
memory alone — how many requests fit at once, and how much of the reserved memory holds tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque

from minipaged.kv.allocator import BlockPool, NoFreeBlocksError
from minipaged.kv.block_table import BlockTable
from minipaged.kv.contiguous import ArenaFullError, FirstFitArena
from minipaged.sim.traces import Request
from minipaged.utils import cdiv


class _Replay(ABC):
    """One memory system under replay: FIFO admission, one token per running request per step."""

    def __init__(self) -> None:
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # request_id -> request, in admission order
        self.tokens: dict[int, int] = {}  # request_id -> tokens held
        self.resume_tokens: dict[int, int] = {}  # preempted request_id -> tokens to recompute on resumption
        self.admitted: set[int] = set()
        self.finished = 0
        self.preemptions = 0
        self.series: dict[str, list[float]] = {
            k: [] for k in ("running", "admitted", "finished", "queue_len", "used_slots", "allocated_slots",
                            "external_fragmentation")
        }

    def step(self, arrivals: list[Request]) -> None:
        preempted = self._grow()
        self.waiting.extend(arrivals)
        # Like vLLM, a step that had to preempt admits nothing new (the victims would thrash).
        while self.waiting and not preempted:
            request = self.waiting[0]
            num_tokens = self.resume_tokens.get(request.request_id, request.prompt_len)
            if not self._admit(request, num_tokens):
                break
            self.waiting.popleft()
            self.resume_tokens.pop(request.request_id, None)
            self.running[request.request_id] = request
            self.tokens[request.request_id] = num_tokens
            self.admitted.add(request.request_id)
        for name, value in self._measure().items():
            self.series[name].append(value)

    def _grow(self) -> bool:
        """Each running request gains one token; finished requests release memory. Returns whether any was preempted."""
        preempted = False
        for request in list(self.running.values()):
            if request.request_id not in self.running:  # preempted earlier in this loop
                continue
            if self.tokens[request.request_id] == request.total_len:
                self._release(request)
                self.finished += 1
            elif self._append_token(request):
                self.tokens[request.request_id] += 1
            else:
                preempted = True
        return preempted

    def _release(self, request: Request) -> None:
        del self.running[request.request_id], self.tokens[request.request_id]

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop the request's memory, queue it first, keep its progress."""
        self.resume_tokens[request.request_id] = self.tokens[request.request_id]
        self._release(request)
        self.waiting.appendleft(request)
        self.preemptions += 1

    def _measure(self) -> dict[str, float]:
        return {"running": len(self.running), "admitted": len(self.admitted), "finished": self.finished,
                "queue_len": len(self.waiting), "used_slots": sum(self.tokens.values())}

    @abstractmethod
    def _admit(self, request: Request, num_tokens: int) -> bool:
        """Allocate memory for ``num_tokens`` tokens of a new request; False (nothing changed) if it does not fit."""

    @abstractmethod
    def _append_token(self, request: Request) -> bool:
        """Make room for one more token of a running request; False if the request was preempted instead."""


class _ContiguousReplay(_Replay):
    """Stage 0: each admitted request reserves its buffer once and never grows it."""

    def __init__(self, num_slots: int, max_seq_len: int, reserve: str) -> None:
        super().__init__()
        self.arena = FirstFitArena(num_slots)
        self.max_seq_len, self.reserve = max_seq_len, reserve

    def _admit(self, request: Request, num_tokens: int) -> bool:
        size = self.max_seq_len if self.reserve == "max" else request.total_len
        try:
            self.arena.reserve(request.request_id, size)
        except ArenaFullError:
            return False
        return True

    def _append_token(self, request: Request) -> bool:
        return True  # the reservation already covers the whole output

    def _release(self, request: Request) -> None:
        self.arena.free(request.request_id)
        super()._release(request)

    def _measure(self) -> dict[str, float]:
        return {**super()._measure(), "allocated_slots": self.arena.num_slots - self.arena.free_slots,
                "external_fragmentation": self.arena.external_fragmentation}


class _PagedReplay(_Replay):
    """Stages 1-2: blocks on demand; when the pool runs dry the newest request is preempted (recompute)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__()
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.tables: dict[int, BlockTable] = {}

    def _admit(self, request: Request, num_tokens: int) -> bool:
        table = BlockTable(self.block_size)
        try:
            table.append_tokens(num_tokens, self.pool)
        except NoFreeBlocksError:
            return False
        self.tables[request.request_id] = table
        return True

    def _append_token(self, request: Request) -> bool:
        """Grow by one token, preempting the newest running requests until it fits; False if ``request`` itself went."""
        while True:
            try:
                self.tables[request.request_id].append_tokens(1, self.pool)
                return True
            except NoFreeBlocksError:
                victim = next(reversed(self.running.values()))
                self._preempt(victim)
                if victim is request:
                    return False

    def _release(self, request: Request) -> None:
        self.tables.pop(request.request_id).free(self.pool)
        super()._release(request)

    def _measure(self) -> dict[str, float]:
        # Any free block serves any request, so paged memory has no external fragmentation.
        return {**super()._measure(), "allocated_slots": self.pool.num_used_blocks * self.block_size,
                "external_fragmentation": 0.0}


def simulate_contiguous_vs_paged(
    trace: list[Request], num_slots: int, block_size: int, max_seq_len: int, reserve: str = "max"
) -> dict:
    """Replay ``trace`` through stage 0 and stages 1-2 with the same ``num_slots`` of KV memory.

    Contiguous reserves ``max_seq_len`` slots per request (``reserve="max"``) or exactly
    prompt + output (``"exact"``, an oracle no real server has); paged gets
    ``num_slots // block_size`` blocks. A request holds its prompt at admission and gains one
    token per step until it has ``total_len``, then frees its memory.

    Returns ``{"time": [...], "contiguous": series, "paged": series, "totals": {...}}`` where each
    series maps ``running``, ``admitted`` (cumulative, distinct), ``finished``, ``queue_len``,
    ``used_slots`` (holding a token), ``allocated_slots`` (reserved or in allocated blocks) and
    ``external_fragmentation`` to one value per step; both series run until both systems finish.
    """
    if reserve not in ("max", "exact"):
        raise ValueError(f"reserve must be 'max' or 'exact', got {reserve!r}")
    too_long = [r.request_id for r in trace if r.total_len > max_seq_len]
    if too_long:
        raise ValueError(f"requests {too_long[:5]} exceed max_seq_len {max_seq_len}")
    num_blocks = num_slots // block_size
    if max_seq_len > num_slots or cdiv(max_seq_len, block_size) > num_blocks:
        raise ValueError(f"one max_seq_len ({max_seq_len}) request must fit in {num_slots} slots")
    systems = {"contiguous": _ContiguousReplay(num_slots, max_seq_len, reserve),
               "paged": _PagedReplay(num_blocks, block_size)}
    pending = deque(sorted(trace, key=lambda r: (r.arrival, r.request_id)))
    time: list[int] = []
    t = 0
    while pending or any(s.running or s.waiting for s in systems.values()):
        arrivals = []
        while pending and pending[0].arrival <= t:
            arrivals.append(pending.popleft())
        for system in systems.values():
            system.step(arrivals)
        time.append(t)
        t += 1
    totals = {}
    for name, s in systems.items():
        steps = max((i + 1 for i, n in enumerate(s.series["running"]) if n > 0), default=0)
        totals[name] = {
            "finished": s.finished,
            "preemptions": s.preemptions,
            "steps": steps,  # until its last request finished
            "peak_running": max(s.series["running"], default=0),
            "mean_running": sum(s.series["running"]) / max(steps, 1),
            # Share of allocated memory holding tokens, over the whole run.
            "token_utilization": sum(s.series["used_slots"]) / max(sum(s.series["allocated_slots"]), 1),
            "final_allocated_slots": s.series["allocated_slots"][-1] if time else 0,
        }
    return {"time": time, "reserve": reserve, **{name: s.series for name, s in systems.items()}, "totals": totals}
