"""Continuous batching: which sequences run each step, with how many new tokens, and what
happens to them once the step's tokens are sampled.

Each step every running sequence asks for the tokens it still lacks K/V for (a decode asks for
one; a prompt, or a sequence resumed after preemption, asks for many and is prefilled in chunks
when the step's token budget is smaller). Running sequences go first, oldest first; when the
pool cannot hold a sequence's new tokens, the most recently admitted one is preempted: its
blocks are freed and it goes back to the front of the waiting queue, to be recomputed later.
Waiting sequences are admitted in FIFO order while ``max_num_seqs``, the token budget and free
memory allow.

After the model ran, :meth:`Scheduler.advance` counts the computed tokens and forks the ``n``
samples of a prompt that just finished prefilling; :meth:`Scheduler.postprocess` appends the
sampled tokens and applies the stop rules: finished sequences leave and their blocks are freed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from minipaged.engine.kv_manager import KVManager
from minipaged.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    """seqs[i] computes q_lens[i] new tokens this step; ``preempted`` lost their blocks this step."""

    seqs: list[Sequence] = field(default_factory=list)
    q_lens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.seqs.append(seq)
        self.q_lens.append(num_tokens)


def _seats(seq: Sequence) -> int:
    """Places in ``max_num_seqs`` a sequence takes: its ``n`` samples once the prompt is done."""
    return seq.params.n if seq.fork_pending else 1


class Scheduler:
    def __init__(
        self,
        kv: KVManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self.num_preemptions = 0
        self.num_prefill_tokens_computed = 0  # prompts, chunks and recomputation: every token but decodes

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- before the step -------------------------------------------------------------------
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
                batch.add(seq, n)
                budget -= n
        # Admit only when nothing had to be preempted: memory is tight otherwise.
        seats = sum(_seats(s) for s in self.running)
        while self.waiting and not batch.preempted and budget > 0:
            seq = self.waiting[0]
            if seats + _seats(seq) > self.max_num_seqs:
                break
            n = self.kv.admit(seq, budget)
            if n == 0:
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            seats += _seats(seq)
            batch.add(seq, n)
            budget -= n
        return batch

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = Status.WAITING
        seq.num_computed_tokens = 0  # everything is recomputed on resumption
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)
        self.num_preemptions += 1

    # -- after the step --------------------------------------------------------------------
    def advance(self, batch: ScheduledBatch) -> list[tuple[int, Sequence]]:
        """The batch ran: count its computed tokens. Returns ``(row, seq)`` for every sequence
        that samples now (a prompt whose last chunk ran, a decode), the forked samples of a
        finished prompt included: they sample from their parent's row."""
        to_sample = []
        for row, (seq, n) in enumerate(zip(batch.seqs, batch.q_lens)):
            if not seq.is_decode(n):
                self.num_prefill_tokens_computed += n
            seq.num_computed_tokens += n
            if seq.num_computed_tokens < len(seq):
                continue  # a prefill chunk that did not reach the end: nothing to sample yet
            to_sample.append((row, seq))
            if seq.fork_pending:
                seq.fork_pending = False
                to_sample += [(row, child) for child in self._fork(seq)]
        return to_sample

    def _fork(self, parent: Sequence) -> list[Sequence]:
        children = []
        for i in range(1, parent.params.n):
            child = parent.fork(i)
            self.kv.fork(parent, child)
            child.status = Status.RUNNING
            self.running.append(child)
            children.append(child)
        return children

    def postprocess(self, seqs: list[Sequence], token_ids: list[int]) -> list[Sequence]:
        """Append each sampled token; finish the sequences that stop. Returns the finished ones."""
        finished = []
        for seq, token in zip(seqs, token_ids):
            seq.token_ids.append(token)
            if not seq.params.ignore_eos and token in self.eos_token_ids:
                self._finish(seq, "stop")
            elif seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.max_model_len:
                self._finish(seq, "length")
            else:
                continue
            finished.append(seq)
        return finished

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        self.running.remove(seq)
        self.kv.free(seq)

    def abort(self, seqs: Iterable[Sequence]) -> None:
        """Drop unfinished sequences wherever they are (finish reason ``"abort"``), freeing their blocks."""
        for seq in seqs:
            if seq.status is Status.FINISHED:
                continue
            if seq.status is Status.RUNNING:
                self.running.remove(seq)
            else:
                self.waiting.remove(seq)
            self.kv.free(seq)
            seq.status = Status.FINISHED
            seq.finish_reason = "abort"
