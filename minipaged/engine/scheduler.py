"""Continuous batching: which sequences run this step, and with how many new tokens.

Each step every running sequence asks for the tokens it still lacks K/V for (a decode asks for
one; a prompt, or a sequence resumed after preemption, asks for many and is prefilled in chunks
when the step's token budget is smaller). Running sequences go first, oldest first; when the pool
cannot hold a sequence's new tokens, the most recently admitted one is preempted: its blocks are
freed and it goes back to the front of the waiting queue, to be recomputed later. Waiting
sequences are admitted in FIFO order while ``max_num_seqs``, the token budget and free memory allow.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minipaged.engine.block_manager import ContiguousKVManager, PagedKVManager
from minipaged.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    """seqs[i] computes q_lens[i] new tokens this step; ``preempted`` lost their blocks this step."""

    seqs: list[Sequence] = field(default_factory=list)
    q_lens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)


class Scheduler:
    def __init__(
        self, kv: PagedKVManager | ContiguousKVManager, max_num_seqs: int, max_num_batched_tokens: int
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = Status.WAITING
        seq.num_computed_tokens = 0  # everything is recomputed on resumption
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)
        self.num_preemptions += 1

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            n = min(len(seq) - seq.num_computed_tokens, budget)
            while not self.kv.can_schedule(seq, n):
                self._preempt(self.running[-1], batch)
                if seq.status is not Status.RUNNING:
                    break
            else:
                self.kv.allocate(seq, n)
                batch.seqs.append(seq)
                batch.q_lens.append(n)
                budget -= n
        # Admit only when nothing had to be preempted: memory is tight otherwise.
        while self.waiting and not batch.preempted and budget > 0:
            seq = self.waiting[0]
            if len(self.running) + (seq.params.n if seq.fork_pending else 1) > self.max_num_seqs:
                break
            self.kv.match_prefix(seq)
            n = min(len(seq) - seq.num_computed_tokens, budget)
            if not self.kv.can_schedule(seq, n):
                self.kv.undo_match(seq)
                seq.num_computed_tokens = seq.num_cached_tokens = 0
                break
            self.kv.allocate(seq, n)
            self.kv.hit_tokens += seq.num_cached_tokens
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.q_lens.append(n)
            budget -= n
        return batch

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        self.running.remove(seq)
        self.kv.free(seq)

    def add_running(self, seq: Sequence) -> None:
        """A forked sample joins the running sequences (its blocks are already shared)."""
        seq.status = Status.RUNNING
        self.running.append(seq)
