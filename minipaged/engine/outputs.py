"""What the engine hands back: request outputs (as in vLLM), step snapshots and pool figures.

A :class:`StepSnapshot` copies the whole pool's state (every block's ``ref_cnt``), so it is
built only when :meth:`LLM.step` is called by a user who wants to look; ``generate`` never
builds one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.engine.kv_manager import KVManager, PagedKVManager
from minipaged.engine.scheduler import ScheduledBatch, Scheduler
from minipaged.engine.sequence import Sequence


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


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
class Request:
    """What the engine keeps of one request: the prompt and its sequences (``seqs`` is the
    family list the samples share, so samples forked later appear in it)."""

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]

    def output(self, tokenizer) -> RequestOutput:
        """The request's output so far: its samples in order, decoded without the stop token."""
        outs = []
        for s in sorted(self.seqs, key=lambda s: s.sample_index):
            shown = s.output_token_ids[:-1] if s.finish_reason == "stop" else s.output_token_ids
            text = tokenizer.decode(shown) if tokenizer is not None else ""
            outs.append(CompletionOutput(s.sample_index, text, s.output_token_ids, s.finish_reason))
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs, self.seqs[0].num_cached_tokens)


@dataclass
class StepSnapshot:
    """What one :meth:`LLM.step` did, and the state it left (for drawing).

    ``scheduled``: one dict per sequence run (``seq_id``, ``request_id``, ``kind`` = "prefill" or
    "decode", ``num_tokens`` computed this step, ``num_computed_tokens`` already in the cache
    before it — prefix hits included); ``block_tables``: seq_id -> physical block ids of every
    running sequence; ``num_tokens``: seq_id -> tokens in the cache; ``ref_cnt`` / ``cached``:
    per physical block (paged cache only).
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


def describe_batch(batch: ScheduledBatch) -> list[dict]:
    """The ``scheduled`` entries of a snapshot; call it before the step runs."""
    return [
        dict(
            seq_id=s.seq_id,
            request_id=s.request_id,
            kind="decode" if s.is_decode(n) else "prefill",
            num_tokens=n,
            num_computed_tokens=s.num_computed_tokens,
        )
        for s, n in zip(batch.seqs, batch.q_lens)
    ]


def take_snapshot(
    step: int, scheduled: list[dict], batch: ScheduledBatch, finished: list[RequestOutput], scheduler: Scheduler
) -> StepSnapshot:
    live = scheduler.running
    snap = StepSnapshot(
        step=step,
        scheduled=scheduled,
        preempted=[s.seq_id for s in batch.preempted],
        finished=finished,
        waiting=[s.seq_id for s in scheduler.waiting],
        running=[s.seq_id for s in live],
        block_tables={s.seq_id: list(s.block_table.block_ids) for s in live},
        num_tokens={s.seq_id: s.num_computed_tokens for s in live},
    )
    kv = scheduler.kv
    if isinstance(kv, PagedKVManager):
        snap.ref_cnt = [b.ref_cnt for b in kv.pool.blocks]
        snap.cached = [b.block_hash is not None for b in kv.pool.blocks]
        snap.num_free_blocks = kv.pool.num_free_blocks
    return snap


def kv_stats(kv: KVManager, scheduler: Scheduler, num_blocks: int, block_size: int) -> dict:
    """Pool figures: blocks, free blocks, preemptions, live tokens vs allocated slots, prefix hits."""
    stats = dict(
        kv_layout="paged" if isinstance(kv, PagedKVManager) else "contiguous",
        num_blocks=num_blocks,
        block_size=block_size,
        num_preemptions=scheduler.num_preemptions,
        tokens_held=kv.tokens_held(scheduler.running),
        slots_allocated=kv.slots_allocated(),
        prefill_tokens_computed=scheduler.num_prefill_tokens_computed,
        peak_slots_allocated=kv.peak_slots_allocated,
    )
    stats.update(kv.stats())
    return stats
