"""What each engine step did, read off two consecutive ``StepSnapshot``s: the data behind an animation.

A :class:`~minipaged.engine.llm.StepSnapshot` tells what a step scheduled and the state it left
(block tables, per-block ``ref_cnt`` and ``cached`` flags). Comparing it with the snapshot before
names the events a learner should see:

- a **prefix hit**: a newly admitted sequence whose first blocks came from the prefix cache;
- **growth**: blocks appended to a table; **copy-on-write**: a table entry replaced by a new block
  (the sequence wrote into a block it shared with a forked sibling, so it got its own copy);
- a **fork**: a new sequence that starts with its parent's table (``SamplingParams(n > 1)``);
- an **eviction**: a block that held a cached prefix was handed out again, so its cached content
  is gone (the least recently freed cached block goes first);
- **preemption**, **finishing** and the blocks they **freed** (``ref_cnt`` back to 0).

:func:`build_frames` turns a list of snapshots into :class:`Frame`s (events, a one-line caption,
running totals) and names and colours every sequence so no two sequences alive at once share a
colour. :func:`prefix_frames` and :func:`engine_frames` run the two scripted scenarios of
``python -m minipaged animate``. Drawing lives in :mod:`minipaged.viz.animate`; this module is
plain data, so tests assert on it without looking at pixels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minipaged.viz.palette import SEQUENCE_COLORS, Ink, inks_over_time, owner_inks

if TYPE_CHECKING:
    from minipaged import StepSnapshot


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


@dataclass
class Frame:
    """One animation frame: a step's snapshot, what changed, and the caption that says so."""

    snapshot: StepSnapshot
    events: StepEvents
    caption: str
    totals: dict[str, int]  # running totals: prefix_hit_tokens, cow_copies, evictions, preemptions


@dataclass
class Movie:
    """Frames plus what every frame shares: sequence names and colours, pool geometry."""

    title: str
    frames: list[Frame]
    names: dict[int, str]
    inks: dict[int, Ink]  # seq_id -> colour (and hatch), never shared by two sequences alive at once
    block_size: int
    num_blocks: int
    token_budget: int | None = None  # the engine's max_num_batched_tokens, when known

    def head(self, max_frames: int | None) -> Movie:
        """The first ``max_frames`` frames (all when None), for short previews and fast tests."""
        frames = self.frames if max_frames is None else self.frames[:max_frames]
        return dataclasses.replace(self, frames=frames)


def request_letter(request_id: int) -> str:
    """Request 0 is ``A``, 1 is ``B``, ... (``R26`` and up past ``Z``)."""
    return chr(ord("A") + request_id) if request_id < 26 else f"R{request_id}"


def seq_names(snapshots: Sequence[StepSnapshot], request_name: Callable[[int], str] = request_letter) -> dict[int, str]:
    """seq_id -> ``A`` for a request's first sequence, ``A.1``, ``A.2`` for its forked samples."""
    request: dict[int, int] = {}
    for snap in snapshots:
        for d in snap.scheduled:
            request.setdefault(d["seq_id"], d["request_id"])
    names, seen = {}, {}
    for seq_id in sorted(request):
        k = seen[request[seq_id]] = seen.get(request[seq_id], -1) + 1
        names[seq_id] = request_name(request[seq_id]) + (f".{k}" if k else "")
    return names


def _live(snap: StepSnapshot) -> list[int]:
    return list(snap.running) + [s for s in snap.waiting if s not in snap.running]


def step_events(prev: StepSnapshot | None, snap: StepSnapshot, block_size: int) -> StepEvents:
    """Compare snapshot ``snap`` with the one before it (``prev``; None before the first step)."""
    prev_tables = prev.block_tables if prev else {}
    prev_cached = prev.cached if prev else [False] * len(snap.cached)
    prev_ref = prev.ref_cnt if prev else [0] * len(snap.ref_cnt)
    prev_live = set(_live(prev)) if prev else set()
    scheduled = {d["seq_id"]: d for d in snap.scheduled}
    ev = StepEvents(preempted=list(snap.preempted))
    ev.arrived = [s for s in _live(snap) if s not in prev_live]
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
            work = scheduled[seq]
            # a newly admitted sequence's prefix hit: what was in the cache before its first step
            n_hit = work["num_computed_tokens"] // block_size if work["kind"] == "prefill" else 0
            if n_hit:
                ev.hits[seq] = table[:n_hit]
                ev.revived += [b for b in table[:n_hit] if prev_ref[b] == 0 and b not in ev.revived]
            old = table[:n_hit]
        for a, b in zip(old, table):
            if a != b:
                ev.cow.append((seq, a, b))
                allocated.append(b)
        if table[len(old) :]:
            ev.grown[seq] = table[len(old) :]
            allocated += table[len(old) :]
    gone = [s for s in prev_tables if s not in snap.block_tables and s not in snap.preempted]
    ev.finished = gone
    ev.evicted = sorted(
        {b for b in allocated if prev_cached[b]} | {b for b, c in enumerate(snap.cached) if prev_cached[b] and not c}
    )
    ev.freed = [b for b, r in enumerate(snap.ref_cnt) if prev_ref[b] > 0 and r == 0]
    return ev


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _freed_by(ev: StepEvents, prev_tables: dict[int, list[int]], seqs: Sequence[int]) -> list[int]:
    """The blocks of ``seqs`` (as they were before the step) that this step freed."""
    mine = {b for s in seqs for b in prev_tables.get(s, [])}
    return [b for b in ev.freed if b in mine]


def _blocks(ids: Sequence[int]) -> str:
    return ("block " if len(ids) == 1 else "blocks ") + ", ".join(map(str, ids))


def caption(
    prev: StepSnapshot | None, snap: StepSnapshot, ev: StepEvents, names: dict[int, str], block_size: int
) -> str:
    """One clause per event, in the order the step did them; a plain summary when nothing special happened."""
    prev_tables = prev.block_tables if prev else {}

    def nm(seq: int) -> str:
        return names.get(seq, f"seq {seq}")

    parts = []
    for seq in ev.preempted:
        n = len(_freed_by(ev, prev_tables, [seq]))
        parts.append(
            f"the pool is full: {nm(seq)}, the newest running sequence, is preempted and gives back "
            f"{_plural(n, 'block')}; it will be recomputed later"
        )
    for seq, old, new in ev.cow:
        keep = [nm(s) for s, t in snap.block_tables.items() if old in t]
        parts.append(
            f"copy-on-write: {nm(seq)} writes into block {old}, which it shares, so it gets its own copy, "
            f"block {new}" + (f"; {', '.join(keep)} keeps block {old}" if keep else "")
        )
    for seq in ev.admitted:
        hit = ev.hits.get(seq, [])
        d = next(d for d in snap.scheduled if d["seq_id"] == seq)
        what = (
            f"{nm(seq)} arrives and is admitted"
            if seq in ev.arrived
            else f"{nm(seq)} resumes after preemption"
            if seq in ev.resumed
            else f"{nm(seq)} is admitted"
        )
        if hit:
            revived = " from the free queue" if set(hit) <= set(ev.revived) else ""
            what += f": {len(hit)} cached blocks hit{revived} ({len(hit) * block_size} tokens),"
        else:
            what += ":"
        parts.append(f"{what} {'recomputes' if seq in ev.resumed else 'prefills'} {d['num_tokens']} tokens")
    arrived = [nm(s) for s in ev.arrived if s not in ev.admitted]
    if arrived:
        parts.append(f"{', '.join(arrived)} {'arrives' if len(arrived) == 1 else 'arrive'} and waits")
    takers = {b: s for s, bs in ev.grown.items() for b in bs} | {new: s for s, _, new in ev.cow}
    for seq in dict.fromkeys(takers[b] for b in ev.evicted if b in takers):
        mine = [b for b in ev.evicted if takers.get(b) == seq]
        parts.append(
            f"{nm(seq)} needs {_plural(len(mine), 'block')}: {_blocks(mine)}, least recently freed, "
            f"evicted from the prefix cache"
        )
    for parent, child in ev.forked:
        shared = len(snap.block_tables[child])
        parts.append(f"{nm(parent)} forks {nm(child)}: both share its {shared} blocks")
    chunks = [d for d in snap.scheduled if d["kind"] == "prefill" and d["seq_id"] not in ev.admitted]
    parts += [
        f"{nm(d['seq_id'])} prefills {d['num_tokens']} more tokens (chunked prefill: "
        f"{snap.num_tokens.get(d['seq_id'], 0)} in cache)"
        for d in chunks
    ]
    if ev.finished:
        freed = _freed_by(ev, prev_tables, ev.finished)
        kept = sum(snap.cached[b] for b in freed)
        parts.append(
            f"{', '.join(nm(s) for s in ev.finished)} finished: {_plural(len(freed), 'block')} freed"
            + (f" ({kept} stay cached)" if kept else "")
        )
    decodes = sum(d["kind"] == "decode" for d in snap.scheduled)
    if not parts:
        parts.append(
            f"{decodes} sequences decode one token each"
            if decodes > 1
            else "1 sequence decodes one token"
            if decodes
            else "nothing to run"
        )
    for seq, blocks in ev.grown.items():
        if seq not in ev.admitted and not any(b in takers and b in ev.evicted for b in blocks):
            parts.append(f"{nm(seq)}'s table grows by {_blocks(blocks)}")
    return f"step {snap.step}: " + "; ".join(parts)


def build_frames(
    snapshots: Sequence[StepSnapshot],
    block_size: int,
    num_blocks: int,
    title: str = "",
    names: dict[int, str] | None = None,
    token_budget: int | None = None,
) -> Movie:
    """A :class:`Movie` with one frame per snapshot (paged cache only: snapshots need ``ref_cnt``).

    For a run of your own: ``build_frames(snaps, llm.block_size, llm.num_blocks, "my run")``, where
    ``snaps`` are what ``llm.step()`` returned, every one from the first step on (a run watched
    from the middle works too; its first frame simply finds its sequences already there).
    """
    names = dict(names or seq_names(snapshots))
    for snap in snapshots:  # sequences never scheduled in these snapshots keep their id
        for s in [*_live(snap), *snap.block_tables]:
            names.setdefault(s, f"seq {s}")
    totals = dict(prefix_hit_tokens=0, cow_copies=0, evictions=0, preemptions=0)
    frames, prev, preempted = [], None, set()
    for snap in snapshots:
        ev = step_events(prev, snap, block_size)
        ev.resumed = [s for s in ev.admitted if s in preempted]
        preempted.update(ev.preempted)
        totals = dict(totals)
        totals["prefix_hit_tokens"] += sum(len(b) for b in ev.hits.values()) * block_size
        totals["cow_copies"] += len(ev.cow)
        totals["evictions"] += len(ev.evicted)
        totals["preemptions"] += len(ev.preempted)
        frames.append(Frame(snap, ev, caption(prev, snap, ev, names, block_size), totals))
        prev = snap
    alive = [[names[s] for s in _live(snap)] for snap in snapshots]
    everyone = {n for a in alive for n in a}
    # A colour of its own for each sequence (A blue, B orange, ...) while there are enough; past
    # that, colours are reused, never by two sequences alive at once.
    inks = owner_inks(everyone) if len(everyone) <= len(SEQUENCE_COLORS) else inks_over_time(alive)
    return Movie(
        title, frames, names, {s: inks[n] for s, n in names.items() if n in inks}, block_size, num_blocks, token_budget
    )


# -- the two scripted runs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arrival:
    """A request added before engine step ``step + 1`` (idle stretches are skipped)."""

    step: int
    text: str
    preamble: str = ""
    n: int = 1


@dataclass(frozen=True)
class Scenario:
    """An engine configuration (``LLM`` keyword arguments) and the requests that arrive while it runs."""

    title: str
    engine: dict
    arrivals: list[Arrival] = field(default_factory=list)
    max_tokens: int = 32


SYSTEM = "You are a careful copy machine. "  # 32 characters: 4 full blocks of 8 tokens
SCENARIOS = {
    # Four requests share a preamble; C samples twice (a fork, then copy-on-write); D, with another
    # preamble, takes the last never-used blocks, so later growth evicts cached blocks (least
    # recently freed first); E, after everyone else sharing it is gone, still finds the preamble cached.
    "prefix": Scenario(
        "Prefix caching: shared blocks, copy-on-write, LRU eviction",
        dict(
            block_size=8, num_kvcache_blocks=16, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=True
        ),
        [
            Arrival(0, "kv cache", SYSTEM),
            Arrival(2, "paged blocks", SYSTEM),
            Arrival(4, "fork me", SYSTEM, n=2),
            Arrival(9, "eviction", "Say it back: "),
            Arrival(16, "lru", SYSTEM),
        ],
    ),
    # Five requests on a small pool with a 16-token budget: prompts are prefilled in chunks, tables
    # grow as tokens are decoded, the newest sequence is preempted when the pool runs dry.
    "engine": Scenario(
        "Continuous batching: chunked prefill, growing tables, preemption",
        dict(block_size=8, num_kvcache_blocks=12, max_num_seqs=4, max_num_batched_tokens=16),
        [
            Arrival(0, "continuous batching"),
            Arrival(0, "pages"),
            Arrival(2, "chunked prefill splits", "long prompt: "),
            Arrival(5, "preempt me"),
            Arrival(8, "done"),
        ],
    ),
}


def run_scenario(scenario: Scenario, max_steps: int = 200) -> Movie:
    """Run the embedded model through ``scenario`` and turn its snapshots into a :class:`Movie`."""
    from minipaged import LLM, SamplingParams
    from minipaged.tiny.task import prompt_for

    llm = LLM(**scenario.engine)
    pending = sorted(scenario.arrivals, key=lambda a: a.step)
    snapshots, skipped = [], 0
    while (pending or llm.has_unfinished_requests()) and len(snapshots) < max_steps:
        if not llm.has_unfinished_requests():  # idle until the next arrival: skip the empty steps
            skipped = pending[0].step - len(snapshots)
        while pending and pending[0].step - skipped <= len(snapshots):
            a = pending.pop(0)
            llm.add_request(
                prompt_for(a.text, a.preamble), SamplingParams(temperature=0, max_tokens=scenario.max_tokens, n=a.n)
            )
        snapshots.append(llm.step())
    return build_frames(
        snapshots,
        llm.block_size,
        llm.num_blocks,
        scenario.title,
        token_budget=scenario.engine["max_num_batched_tokens"],
    )


def prefix_frames(max_steps: int = 200) -> Movie:
    """The ``prefix`` run: sharing a preamble, a fork with copy-on-write, eviction, a hit after eviction."""
    return run_scenario(SCENARIOS["prefix"], max_steps)


def engine_frames(max_steps: int = 200) -> Movie:
    """The ``engine`` run: arrivals, chunked prefill, block tables growing, preemption and resumption."""
    return run_scenario(SCENARIOS["engine"], max_steps)
