"""The live figures and projector frames, kept up to date by the engine thread.

After every step the engine loop calls :meth:`LiveState.observe` with the step's snapshot (built
from what the step handed back and the pool summary; cheap: the step's events are added up, the
tokens counted); every ``FRAME_INTERVAL`` seconds, and whenever the engine goes idle,
:meth:`LiveState.publish` builds a projector frame and the figures ``/metrics`` reports from the
engine's public figures (:meth:`LLM.pool_summary`, which carries ``kv_stats()``). Both run on
the engine thread, the only one allowed to read the engine. The event loop only
reads what was published: ``frames`` (the last few, numbered, as JSON text) and ``stats``; each is
replaced whole, never changed in place, so reading them from another thread is safe.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import Counter, deque

from minipaged.engine.llm import LLM
from minipaged.engine.pool_summary import PoolSummary
from minipaged.serve import projector
from minipaged.viz.snapshot import StepSnapshot

FRAME_INTERVAL = 0.2  # seconds between frames while the engine runs: 5 a second
RATE_WINDOW = 5.0  # seconds of history behind tokens/s and steps/s
LABELS_KEPT = 4096
FRAMES_KEPT = 32


class LiveState:
    def __init__(self, llm: LLM) -> None:
        self.num_blocks, self.block_size = llm.num_blocks, llm.block_size
        self.layout = llm.kv_stats()["kv_layout"]
        self.prev: StepSnapshot | None = None
        self.events = projector.no_events()
        self.frames: tuple[tuple[int, str], ...] = ()  # (number, JSON), replaced whole: safe to read anywhere
        self.frame_no = 0
        self.last_publish = float("-inf")
        self.totals: Counter = Counter(
            requests_added=0,
            requests_finished=0,
            requests_aborted=0,
            requests_failed=0,
            failed_steps=0,
            prompt_tokens=0,
            generation_tokens=0,
            evictions=0,
        )
        self.labels: dict[int, str] = {}
        self.recent: deque[tuple[float, int]] = deque()  # (time, tokens) of each step
        self.ttfts: deque[float] = deque(maxlen=100)
        self.stats: dict = {}

    # -- per request, per step -------------------------------------------------------------
    def added(self, request_id: int, label: str, num_prompt_tokens: int) -> None:
        self.labels[request_id] = label or f"R{request_id}"
        if len(self.labels) > LABELS_KEPT:
            del self.labels[next(iter(self.labels))]
        self.totals["requests_added"] += 1
        self.totals["prompt_tokens"] += num_prompt_tokens

    def first_token(self, seconds: float) -> None:
        self.ttfts.append(seconds)

    def observe(self, snap: StepSnapshot, new_tokens: int, now: float) -> None:
        step = projector.step_events(self.prev, snap, self.block_size)
        projector.merge_events(self.events, step)
        self.totals["evictions"] += len(step["evicted"])
        self.totals["generation_tokens"] += new_tokens
        self.recent.append((now, new_tokens))
        while self.recent and now - self.recent[0][0] > RATE_WINDOW:
            self.recent.popleft()
        self.prev = snap

    # -- published -------------------------------------------------------------------------
    def figures(self, now: float) -> dict:
        span = max(now - self.recent[0][0], 1.0) if self.recent else 1.0
        ttfts = sorted(self.ttfts)
        return {
            "tokens_per_s": round(sum(n for _, n in self.recent) / span, 1),
            "steps_per_s": round(len(self.recent) / span, 1),
            "ttft_ms_mean": round(1000 * statistics.fmean(ttfts), 1) if ttfts else None,
            "ttft_ms_p50": round(1000 * statistics.median(ttfts), 1) if ttfts else None,
        }

    def publish(self, llm: LLM, now: float, force: bool = False) -> None:
        """A new frame and new stats, if one is due (or ``force``)."""
        if not force and now - self.last_publish < FRAME_INTERVAL:
            return
        self.last_publish = now
        pool = llm.pool_summary()
        kv = pool.stats
        seqs = {s.seq_id: (s.request_id, s.sample_index) for s in [*pool.running, *pool.waiting]}
        running = {s.request_id for s in pool.running}
        self.stats = {
            **self.totals,
            **kv,
            "num_requests_running": len(running),
            "num_requests_waiting": len({r for r, _ in seqs.values()} - running),
            "num_steps": self.prev.step + 1 if self.prev is not None else 0,
        }
        figures = {
            **self.figures(now),
            **{k: self.stats[k] for k in ("num_requests_running", "num_requests_waiting", "num_free_blocks")},
            **{k: kv.get(k, 0) for k in ("prefix_hit_tokens", "prefill_tokens_computed", "cow_copies")},
            "preemptions": kv["num_preemptions"],
            "evictions": self.totals["evictions"],
            "requests_finished": self.totals["requests_finished"],
            "generation_tokens": self.totals["generation_tokens"],
            "tokens_held": kv["tokens_held"],
            "slots_allocated": kv["slots_allocated"],
            "layout": self.layout,
        }
        snap = self._now(pool)
        self.frame_no += 1
        picture = projector.frame(snap, seqs, self.labels, self.events, figures, self.num_blocks, self.block_size)
        picture["frame"] = self.frame_no
        self.frames = (*self.frames[-FRAMES_KEPT + 1 :], (self.frame_no, json.dumps(picture)))
        self.events = projector.no_events()

    def _now(self, pool: PoolSummary) -> StepSnapshot:
        """The last step's snapshot brought up to date by ``pool``, read now: requests aborted
        since are gone, and the pool's ``ref_cnt`` and cached flags are today's (paged only)."""
        base = self.prev or StepSnapshot(
            step=0, scheduled=[], preempted=[], finished=[], waiting=[], running=[], block_tables={}, num_tokens={}
        )
        running = [s.seq_id for s in pool.running]
        return dataclasses.replace(
            base,
            running=running,
            waiting=[s.seq_id for s in pool.waiting],
            block_tables={s: base.block_tables[s] for s in running if s in base.block_tables},
            ref_cnt=pool.ref_cnt,
            cached=pool.cached,
        )
