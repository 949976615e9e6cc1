"""A memory-only replay of stage 0 against stages 1-2: the same trace, two memory systems.

No model runs: each running request grows by one token per step, so what is compared is
memory alone — how many requests fit at once, and how much of the reserved memory holds tokens.

Two ways in, one loop underneath:

- :func:`simulate_contiguous_vs_paged` replays a trace through both systems and returns one
  value per step of every quantity (for plots and totals);
- :func:`replay_steps` replays it through one system, a :class:`ContiguousReplay` or a
  :class:`PagedReplay`, and yields that system's state after every step (for pictures of the
  memory at a given step): a :class:`ContiguousState` or a :class:`PagedState`;
- :func:`replay` runs one system to the end and returns it with its per-step ``series``.

The contiguous reservation rules are the PagedAttention paper's baselines (Orca (Max), (Pow2), (Oracle)).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator, Sequence

from minipaged.kv.block_pool import BlockPool, NoFreeBlocksError
from minipaged.kv.block_table import BlockTable
from minipaged.kv.contiguous import ArenaFullError, FirstFitArena
from minipaged.sim.states import ContiguousState, PagedState, ReplayState
from minipaged.sim.traces import TraceRequest
from minipaged.utils import cdiv

RESERVE_POLICIES = ("max", "pow2", "exact")
SERIES = (  # what a replay records, one value per step
    "running",
    "admitted",
    "finished",
    "queue_len",
    "used_slots",
    "allocated_slots",
    "future_slots",
    "external_fragmentation",
)


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= ``n`` (``n >= 1``)."""
    return 1 << (n - 1).bit_length()


class Replay(ABC):
    """One memory system under replay: FIFO admission, one token per running request per step.

    Drive it with :func:`replay_steps` (or :meth:`step`, one step's arrivals at a time); read it
    with :meth:`state`. ``series`` collects one value per step of each quantity
    :func:`simulate_contiguous_vs_paged` reports.
    """

    def __init__(self) -> None:
        self.waiting: deque[TraceRequest] = deque()
        self.running: dict[int, TraceRequest] = {}  # request_id -> request, in admission order
        self.tokens: dict[int, int] = {}  # request_id -> tokens held
        self.resume_tokens: dict[int, int] = {}  # preempted request_id -> tokens to recompute on resumption
        self.admitted: set[int] = set()
        self.finished = 0
        self.preemptions = 0
        self.num_steps = 0
        self.series: dict[str, list[float]] = {name: [] for name in SERIES}

    @property
    def busy(self) -> bool:
        """Whether a request is running or waiting."""
        return bool(self.running or self.waiting)

    def step(self, arrivals: Sequence[TraceRequest]) -> None:
        """One step: running requests grow (or finish), then ``arrivals`` queue and the queue is admitted FIFO."""
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
        self.num_steps += 1
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

    def _release(self, request: TraceRequest) -> None:
        del self.running[request.request_id], self.tokens[request.request_id]

    def _preempt(self, request: TraceRequest) -> None:
        """Recompute preemption: drop the request's memory, queue it first, keep its progress."""
        self.resume_tokens[request.request_id] = self.tokens[request.request_id]
        self._release(request)
        self.waiting.appendleft(request)
        self.preemptions += 1

    def _measure(self) -> dict[str, float]:
        return {
            "running": len(self.running),
            "admitted": len(self.admitted),
            "finished": self.finished,
            "queue_len": len(self.waiting),
            "used_slots": sum(self.tokens.values()),
            # Allocated slots that the request's own later tokens will fill (the rest of its allocation never will).
            "future_slots": sum(
                min(self._slots_of(r), r.total_len) - self.tokens[rid] for rid, r in self.running.items()
            ),
        }

    def _common_state(self) -> dict:
        return {
            "step": self.num_steps - 1,
            "running": tuple(self.running),
            "finished": self.finished,
            "waiting": tuple(r.request_id for r in self.waiting),
            "tokens": dict(self.tokens),
            "preemptions": self.preemptions,
        }

    @abstractmethod
    def state(self) -> ReplayState:
        """A copy of the system after the last step."""

    @abstractmethod
    def check_trace(self, trace: Sequence[TraceRequest]) -> None:
        """Raise ValueError if a request of ``trace`` could never run on this system (it would wait forever)."""

    @abstractmethod
    def _slots_of(self, request: TraceRequest) -> int:
        """The slots a running request holds (reserved, or in its blocks)."""

    @abstractmethod
    def _admit(self, request: TraceRequest, num_tokens: int) -> bool:
        """Allocate memory for ``num_tokens`` tokens of a new request; False (nothing changed) if it does not fit."""

    @abstractmethod
    def _append_token(self, request: TraceRequest) -> bool:
        """Make room for one more token of a running request; False if the request was preempted instead."""


class ContiguousReplay(Replay):
    """Stage 0: each admitted request reserves its buffer once and never grows it.

    ``reserve="max"`` reserves ``max_seq_len`` slots per request (Orca (Max) in the paper),
    ``"pow2"`` the next power of two of its prompt + output, at most ``max_seq_len`` (Orca (Pow2):
    an output length known within 2x), ``"exact"`` its prompt + output (Orca (Oracle), which no
    real server has). ``arena_type`` places the buffers: ``FirstFitArena`` or a subclass with
    another rule (best fit, say).
    """

    def __init__(
        self, num_slots: int, max_seq_len: int, reserve: str = "max", arena_type: type[FirstFitArena] = FirstFitArena
    ) -> None:
        if reserve not in RESERVE_POLICIES:
            raise ValueError(f"reserve must be one of {RESERVE_POLICIES}, got {reserve!r}")
        if max_seq_len > num_slots:
            raise ValueError(f"one max_seq_len ({max_seq_len}) request must fit in {num_slots} slots")
        super().__init__()
        self.arena = arena_type(num_slots)
        self.max_seq_len, self.reserve = max_seq_len, reserve

    def size_of(self, request: TraceRequest) -> int:
        """The slots ``request`` reserves."""
        if self.reserve == "max":
            return self.max_seq_len
        if self.reserve == "pow2":
            return min(next_power_of_two(request.total_len), self.max_seq_len)
        return request.total_len

    def _slots_of(self, request: TraceRequest) -> int:
        return self.size_of(request)

    def check_trace(self, trace: Sequence[TraceRequest]) -> None:
        too_long = [r.request_id for r in trace if r.total_len > self.max_seq_len]
        if too_long:
            raise ValueError(f"requests {too_long[:5]} exceed max_seq_len {self.max_seq_len}")

    def _admit(self, request: TraceRequest, num_tokens: int) -> bool:
        try:
            self.arena.reserve(request.request_id, self.size_of(request))
        except ArenaFullError:
            return False
        return True

    def _append_token(self, request: TraceRequest) -> bool:
        return True  # the reservation already covers the whole output

    def _release(self, request: TraceRequest) -> None:
        self.arena.free(request.request_id)
        super()._release(request)

    def _measure(self) -> dict[str, float]:
        return {
            **super()._measure(),
            "allocated_slots": self.arena.num_slots - self.arena.free_slots,
            "external_fragmentation": self.arena.external_fragmentation,
        }

    def state(self) -> ContiguousState:
        # Contiguous never preempts, so a request still at the head of the queue is one admission just refused.
        held_back = bool(self.waiting) and self.arena.free_slots >= self.size_of(self.waiting[0])
        return ContiguousState(**self._common_state(), arena=copy.deepcopy(self.arena), held_back=held_back)


class PagedReplay(Replay):
    """Stages 1-2: blocks on demand; when the pool runs dry the newest request is preempted (recompute)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__()
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.tables: dict[int, BlockTable] = {}

    def check_trace(self, trace: Sequence[TraceRequest]) -> None:
        too_long = [r.request_id for r in trace if cdiv(r.total_len, self.block_size) > self.pool.num_blocks]
        if too_long:
            raise ValueError(
                f"requests {too_long[:5]} need more than the pool's {self.pool.num_blocks} blocks "
                f"of {self.block_size}: give the pool more blocks"
            )

    def _admit(self, request: TraceRequest, num_tokens: int) -> bool:
        table = BlockTable(self.block_size)
        try:
            table.append_tokens(num_tokens, self.pool)
        except NoFreeBlocksError:
            return False
        self.tables[request.request_id] = table
        return True

    def _append_token(self, request: TraceRequest) -> bool:
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

    def _slots_of(self, request: TraceRequest) -> int:
        return len(self.tables[request.request_id].block_ids) * self.block_size

    def _release(self, request: TraceRequest) -> None:
        self.tables.pop(request.request_id).free(self.pool)
        super()._release(request)

    def _measure(self) -> dict[str, float]:
        # Any free block serves any request, so paged memory has no external fragmentation.
        return {
            **super()._measure(),
            "allocated_slots": self.pool.num_used_blocks * self.block_size,
            "external_fragmentation": 0.0,
        }

    def state(self) -> PagedState:
        return PagedState(
            **self._common_state(),
            block_size=self.block_size,
            ref_cnt=tuple(b.ref_cnt for b in self.pool.blocks),
            free_order=tuple(b.block_id for b in self.pool.free_queue),
            block_tables={rid: tuple(t.block_ids) for rid, t in self.tables.items()},
        )


def _run(trace: Sequence[TraceRequest], systems: Sequence[Replay]) -> Iterator[int]:
    """Step every system through ``trace`` in lockstep; yield each step's number until all are done."""
    pending = deque(sorted(trace, key=lambda r: (r.arrival, r.request_id)))
    t = 0
    while pending or any(s.busy for s in systems):
        arrivals = []
        while pending and pending[0].arrival <= t:
            arrivals.append(pending.popleft())
        for system in systems:
            system.step(arrivals)
        yield t
        t += 1


def _check(trace: Sequence[TraceRequest], systems: Sequence[Replay]) -> None:
    for system in systems:
        if system.num_steps:
            raise ValueError(
                f"this {type(system).__name__} has already run {system.num_steps} steps: replay a trace on a new one"
            )
        system.check_trace(trace)


def replay_steps(trace: Sequence[TraceRequest], system: ContiguousReplay | PagedReplay) -> Iterator[ReplayState]:
    """Replay ``trace`` on a new ``system``; yield its state after every step until the trace is served.

    The states are copies (a :class:`ContiguousState` or a :class:`PagedState`), so a list of
    them is the whole history; ``system`` itself holds the final memory when the loop ends.
    Example: the arena of stage 0 after 300 steps, every request reserving ``max_seq_len``::

        for state in replay_steps(trace, ContiguousReplay(4096, 512, reserve="max")):
            if state.step == 300:
                break
        state.arena.reservations(), state.tokens
    """
    _check(trace, [system])  # now, not at the first next()
    return (system.state() for _ in _run(trace, [system]))


def replay(trace: Sequence[TraceRequest], system: ContiguousReplay | PagedReplay) -> ContiguousReplay | PagedReplay:
    """Replay ``trace`` on a new ``system`` to the end; returns ``system``, its ``series`` filled with
    one value per step (``running``, ``queue_len``, ``used_slots``, ``allocated_slots``,
    ``future_slots``, ...: see :func:`simulate_contiguous_vs_paged`)."""
    _check(trace, [system])
    for _ in _run(trace, [system]):
        pass
    return system


def simulate_contiguous_vs_paged(
    trace: list[TraceRequest], num_slots: int, block_size: int, max_seq_len: int, reserve: str = "max"
) -> dict:
    """Replay ``trace`` through stage 0 and stages 1-2 with the same ``num_slots`` of KV memory.

    Contiguous reserves ``max_seq_len`` slots per request (``reserve="max"``), the next power of
    two of prompt + output (``"pow2"``) or exactly prompt + output (``"exact"``, an oracle no real
    server has); paged gets
    ``num_slots // block_size`` blocks. A request holds its prompt at admission and gains one
    token per step until it has ``total_len``, then frees its memory.

    Returns ``{"time": [...], "contiguous": series, "paged": series, "totals": {...}}`` where each
    series maps ``running``, ``admitted`` (cumulative, distinct), ``finished``, ``queue_len``,
    ``used_slots`` (holding a token), ``allocated_slots`` (reserved or in allocated blocks),
    ``future_slots`` (allocated, to be filled by the request's later tokens) and
    ``external_fragmentation`` to one value per step; both series run until both systems finish.
    """
    num_blocks = num_slots // block_size
    contiguous = ContiguousReplay(num_slots, max_seq_len, reserve)
    if cdiv(max_seq_len, block_size) > num_blocks:
        raise ValueError(f"one max_seq_len ({max_seq_len}) request must fit in {num_blocks} blocks of {block_size}")
    systems = {"contiguous": contiguous, "paged": PagedReplay(num_blocks, block_size)}
    _check(trace, list(systems.values()))
    time = list(_run(trace, list(systems.values())))
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
