"""What the engine hands back: request outputs (as in vLLM), step snapshots and pool figures.

A :class:`StepSnapshot` copies the whole pool's state (every block's ``ref_cnt``), so it is
built only when :meth:`LLM.step` is called by a user who wants to look; ``generate`` never
builds one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.engine.batch import ScheduledBatch
from minipaged.engine.sequence import Sequence


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


@dataclass
class StepSnapshot:
    """What one :meth:`LLM.step` did, and the state it left (for drawing).

    ``scheduled``: one dict per sequence run (``seq_id``, ``request_id``, ``kind`` = "prefill" or
    "decode", ``num_tokens`` computed this step, ``num_computed_tokens`` already in the cache
    before it — prefix hits included); ``outputs``: every request that got a token this step, as
    it stands (``finished``: those it completed); ``block_tables``: seq_id -> physical block ids
    of every running sequence; ``num_tokens``: seq_id -> tokens in the cache; ``ref_cnt`` /
    ``cached``: per physical block (paged cache only).
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


def take_snapshot(
    step: int,
    batch: ScheduledBatch,
    outputs: list[RequestOutput],
    running: list[Sequence],
    waiting: list[Sequence],
    swapped: list[Sequence],
    pool: tuple[list[int], list[bool], int] | None,
) -> StepSnapshot:
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
