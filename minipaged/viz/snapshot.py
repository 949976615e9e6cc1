"""One engine step, recorded for drawing: what it scheduled, and the queues and pool it left.

:meth:`LLM.step` returns only the step's :class:`RequestOutput` s, as vLLM's does. A drawing is
built from what a step hands back (its :class:`~minipaged.engine.step_output.StepOutput`, with
the pool as the step left it, :meth:`LLM.pool_summary`), never from the engine's insides::

    out = llm.engine_step(pool=True)              # the step, as LLM.step runs it, and the pool it left
    snap = take_snapshot(out, out.pool)           # a StepSnapshot of it
    snap = step_snapshot(llm)                     # the same two lines, for a notebook
    snap.scheduled              # [{seq_id, request_id, kind, num_tokens, num_computed_tokens}] per sequence run
    snap.block_tables           # {seq_id: [physical block ids]} of every running sequence
    snap.ref_cnt, snap.cached   # num_blocks ints / bools (paged cache only; empty lists otherwise)
    snap.outputs                # exactly what llm.step() would have returned

A snapshot copies the whole pool's state (every block's ``ref_cnt``), so only the drawing side
builds one, when it draws. The pictures (:mod:`.scheduler`, :mod:`.prefix`, :mod:`.pool_state`),
the step events (:mod:`.step_events`), the animations (:mod:`.animate`) and the server's
projector read snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.engine.llm import LLM
from minipaged.engine.outputs import RequestOutput
from minipaged.engine.pool_summary import PoolSummary
from minipaged.engine.scheduler_output import SchedulerOutput
from minipaged.engine.step_output import StepOutput


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


def describe_batch(batch: SchedulerOutput) -> list[dict]:
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


def take_snapshot(out: StepOutput, pool: PoolSummary) -> StepSnapshot:
    """A snapshot of the step that handed back ``out`` and left ``pool`` (read right after it)."""
    batch = out.scheduler_output
    return StepSnapshot(
        step=out.step,
        scheduled=describe_batch(batch),
        preempted=[s.seq_id for s in batch.preempted],
        finished=[o for o in out.outputs if o.finished],
        waiting=[s.seq_id for s in pool.waiting],
        running=[s.seq_id for s in pool.running],
        block_tables={s.seq_id: list(s.block_ids) for s in pool.running},
        num_tokens={s.seq_id: s.num_computed_tokens for s in pool.running},
        ref_cnt=pool.ref_cnt,
        cached=pool.cached,
        num_free_blocks=pool.num_free_blocks,
        outputs=out.outputs,
        swapped=[s.seq_id for s in pool.swapped],
    )


def step_snapshot(llm: LLM) -> StepSnapshot:
    """Step ``llm`` once (:meth:`LLM.engine_step`, rollback on failure included) and snapshot
    the step from what it handed back and the pool it left. ``outputs`` are the requests that
    got a token, by request id; beam searches report through :meth:`LLM.beam_search`, not per step."""
    out = llm.engine_step(pool=True)
    assert out.pool is not None  # asked for
    return take_snapshot(out, out.pool)
