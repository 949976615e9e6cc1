"""One engine step, recorded for drawing: what it scheduled, and the queues and pool it left.

:meth:`LLM.step` returns only the step's :class:`RequestOutput` s, as vLLM's does. To look inside
a step, run it with :func:`step_snapshot` instead::

    snap = step_snapshot(llm)   # the same step (one llm.run_step()), and a StepSnapshot of it
    snap.scheduled              # [{seq_id, request_id, kind, num_tokens, num_computed_tokens}] per sequence run
    snap.block_tables           # {seq_id: [physical block ids]} of every running sequence
    snap.ref_cnt, snap.cached   # num_blocks ints / bools (paged cache only; empty lists otherwise)
    snap.outputs                # exactly what llm.step() would have returned

A snapshot copies the whole pool's state (every block's ``ref_cnt``), so only the drawing side
builds one, through the engine's public state: ``llm.scheduler.running`` / ``waiting`` /
``swapped`` and, for a paged cache, ``llm.scheduler.paged.pool``. The pictures
(:mod:`.scheduler`, :mod:`.prefix`, :mod:`.pool_state`), the step events (:mod:`.step_events`),
the animations (:mod:`.animate`) and the server's projector read snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.engine.batch import ScheduledBatch
from minipaged.engine.llm import LLM
from minipaged.engine.outputs import RequestOutput
from minipaged.engine.sequence import Sequence


@dataclass
class StepSnapshot:
    """What one step did, and the state it left.

    ``scheduled``: one dict per sequence run (``seq_id``, ``request_id``, ``kind`` = "prefill" or
    "decode", ``num_tokens`` computed this step, ``num_computed_tokens`` already in the cache
    before it — prefix hits included); ``outputs``: every request that got a token this step, as
    it stands (``finished``: those it completed); ``block_tables``: seq_id -> physical block ids
    of every running sequence; ``num_tokens``: seq_id -> tokens in the cache; ``ref_cnt`` /
    ``cached``: per physical block (paged cache only). ``step``: steps run so far, this one included.
    """

    step: int
    scheduled: list[dict]
    preempted: list[int]
    finished: list[RequestOutput]
    waiting: list[int]
    running: list[int]
    block_tables: dict[int, list[int]]
    num_tokens: dict[int, int]
    ref_cnt: list[int] = field(default_factory=list)
    cached: list[bool] = field(default_factory=list)
    num_free_blocks: int = 0
    outputs: list[RequestOutput] = field(default_factory=list)
    swapped: list[int] = field(default_factory=list)


def describe_batch(batch: ScheduledBatch) -> list[dict]:
    """The ``scheduled`` entries of a snapshot."""
    return [
        dict(
            seq_id=s.seq_id,
            request_id=s.request_id,
            kind="decode" if decode else "prefill",
            num_tokens=n,
            num_computed_tokens=start,
        )
        for s, n, start, decode in zip(batch.seqs, batch.q_lens, batch.starts, batch.decode)
    ]


def read_pool(llm: LLM) -> tuple[list[int], list[bool], int] | None:
    """The paged pool as it is now: every block's ``ref_cnt``, whether it is cached (has a
    hash), and the free block count; None for a contiguous cache, which has no blocks."""
    paged = llm.scheduler.paged
    if paged is None:
        return None
    blocks = paged.pool.blocks
    return [b.ref_cnt for b in blocks], [b.block_hash is not None for b in blocks], paged.pool.num_free_blocks


def take_snapshot(
    step: int,
    batch: ScheduledBatch,
    outputs: list[RequestOutput],
    running: list[Sequence],
    waiting: list[Sequence],
    swapped: list[Sequence],
    pool: tuple[list[int], list[bool], int] | None,
) -> StepSnapshot:
    """A snapshot of step ``step``, which ran ``batch`` and left these queues and ``pool``
    (:func:`read_pool`'s triple, or None)."""
    snap = StepSnapshot(
        step=step,
        scheduled=describe_batch(batch),
        preempted=[s.seq_id for s in batch.preempted],
        finished=[o for o in outputs if o.finished],
        waiting=[s.seq_id for s in waiting],
        running=[s.seq_id for s in running],
        block_tables={s.seq_id: list(s.block_table.block_ids) for s in running},
        num_tokens={s.seq_id: s.num_computed_tokens for s in running},
        outputs=outputs,
        swapped=[s.seq_id for s in swapped],
    )
    if pool is not None:
        snap.ref_cnt, snap.cached, snap.num_free_blocks = pool
    return snap


def step_snapshot(llm: LLM) -> StepSnapshot:
    """Run one step of ``llm`` (as :meth:`LLM.step` does, rollback on failure included) and
    snapshot it. ``outputs`` are the requests that got a token, by request id; beam searches
    report through :meth:`LLM.beam_search`, not per step."""
    batch, progressed = llm.run_step()
    requests = sorted({s.request_id for s in progressed if s.group.streams})
    outputs = [llm.get_output(r) for r in requests]
    s = llm.scheduler
    swapped = [q for unit in s.swapped for q in unit]
    return take_snapshot(llm.num_steps, batch, outputs, s.running, list(s.waiting), swapped, read_pool(llm))
