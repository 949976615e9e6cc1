"""What one engine step did, read off two consecutive :class:`StepSnapshot` s.

A snapshot says what the pool and the queues look like after a step; comparing it with the one
before names the step's events: sequences that arrived, were admitted (with prefix-cache hits)
or resumed, block tables that grew, blocks copied on write, samples that forked, cached blocks
evicted, sequences preempted or finished, blocks freed. The animations caption their frames with
them (:mod:`minipaged.viz.animate`), and the server's projector page flashes them
(:mod:`minipaged.serve.projector`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.viz.snapshot import StepSnapshot


@dataclass
class StepEvents:
    """What one step changed. Sequence ids throughout; blocks are physical block ids."""

    arrived: list[int] = field(default_factory=list)  # first seen this step (waiting or running)
    admitted: list[int] = field(default_factory=list)  # started (or, after preemption, restarted) running
    resumed: list[int] = field(default_factory=list)  # the admitted ones that had been preempted before
    hits: dict[int, list[int]] = field(default_factory=dict)  # seq -> blocks shared from the prefix cache
    revived: list[int] = field(default_factory=list)  # hit blocks nobody used before (taken off the free queue)
    grown: dict[int, list[int]] = field(default_factory=dict)  # seq -> new blocks appended to its table
    cow: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, shared block, its new copy)
    forked: list[tuple[int, int]] = field(default_factory=list)  # (parent, child)
    evicted: list[int] = field(default_factory=list)  # cached blocks handed out again
    preempted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)  # blocks whose ref_cnt fell to 0


def live(snap: StepSnapshot) -> list[int]:
    """The sequences a snapshot knows of, running first, each once."""
    return list(dict.fromkeys([*snap.running, *snap.waiting]))


def step_events(prev: StepSnapshot | None, snap: StepSnapshot, block_size: int) -> StepEvents:
    """Compare snapshot ``snap`` with the one before it (``prev``; None before the first step)."""
    prev_tables = prev.block_tables if prev else {}
    prev_cached = prev.cached if prev else [False] * len(snap.cached)
    prev_ref = prev.ref_cnt if prev else [0] * len(snap.ref_cnt)
    scheduled = {d["seq_id"]: d for d in snap.scheduled}
    ev = StepEvents(preempted=list(snap.preempted))
    ev.arrived = [s for s in live(snap) if s not in (live(prev) if prev else [])]
    allocated: list[int] = []
    for seq, table in snap.block_tables.items():
        if seq not in prev_tables and seq not in scheduled:  # a new table nobody computed for: a fork
            parent = next((p for p, t in snap.block_tables.items() if p != seq and p in scheduled and t == table), None)
            if parent is not None:  # (None: a run watched from the middle, this sequence was there before)
                ev.forked.append((parent, seq))
                ev.arrived = [s for s in ev.arrived if s != seq]
            continue
        old = prev_tables.get(seq, [])
        if seq not in prev_tables:
            ev.admitted.append(seq)
            work = scheduled[seq]  # a newly admitted sequence's prefix hit: what was cached before its first step
            old = table[: work["num_computed_tokens"] // block_size if work["kind"] == "prefill" else 0]
            if old:
                ev.hits[seq] = old
                ev.revived += [b for b in old if prev_ref[b] == 0 and b not in ev.revived]
        ev.cow += [(seq, a, b) for a, b in zip(old, table) if a != b]
        allocated += [b for a, b in zip(old, table) if a != b] + table[len(old) :]
        if table[len(old) :]:
            ev.grown[seq] = table[len(old) :]
    ev.finished = [s for s in prev_tables if s not in snap.block_tables and s not in snap.preempted]
    lost = {b for b, c in enumerate(snap.cached) if prev_cached[b] and not c}
    ev.evicted = sorted({b for b in allocated if prev_cached[b]} | lost)
    ev.freed = [b for b, r in enumerate(snap.ref_cnt) if prev_ref[b] > 0 and r == 0]
    return ev
