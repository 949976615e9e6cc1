"""Continuous batching: which sequences run each step, with how many new tokens, and what
happens to them once the step's tokens are sampled.

The scheduler's unit is a request's group (:mod:`~minipaged.engine.request_group`): it says
which sequences are scheduled, preempted and swapped together (one sample, or every live beam
of a beam search, which step in lockstep), the seats they take in ``max_num_seqs``, each
member's share of the token budget, and what to do with what they sample. The scheduler never
asks which kind of request it holds.

**Schedule.** Each step every running unit asks for the tokens it still lacks K/V for (a
decode asks for one; a prompt, or a sequence resumed after preemption, asks for many and is
prefilled in chunks when the step's token budget is smaller). Running units go first, oldest
first; when the pool cannot hold a unit's new tokens, the most recently admitted one is
preempted: swapped to host memory (``preemption_mode="swap"``, while the host pool has room)
or freed, to be recomputed later, and put back at the front of the waiting queue. Swapped
units come back before waiting ones are admitted; waiting ones are admitted in FIFO order while
``max_num_seqs``, the token budget and free memory allow, each with its prefix-cache hit, found
without changing anything and taken only once the unit is admitted.

**Postprocess.** After the batch ran, the computed tokens are counted, the step's transaction
commits (the blocks it filled reach the prefix cache), the prompt logprobs it computed are kept,
and each group that sampled takes its outcome in three phases: new samples fork from their
finished prompt, each row's token is appended in row order (the stop rules finish what is done,
freeing its blocks), and beam searches choose, fork and prune their beams.

**Rollback.** If anything between ``schedule`` and ``postprocess`` fails, :meth:`rollback`
puts every unit the step touched back in the waiting queue to be recomputed (see
:meth:`minipaged.LLM.step`): nothing the step filled is published, no owed copy is replayed,
and every seeded sample gets its random draw back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from minipaged.engine.batch import SamplerOutput, ScheduledBatch
from minipaged.engine.kv_manager import KVManager, PagedKVManager
from minipaged.engine.request_group import RequestGroup, StopChecker
from minipaged.engine.sequence import Sequence, Status
from minipaged.engine.step_transaction import PrefixHit, StepTransaction


class Scheduler:
    def __init__(
        self,
        kv: KVManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        stop: StopChecker,
        preemption_mode: str = "recompute",
        policy: Callable[[Scheduler], ScheduledBatch] | None = None,
    ) -> None:
        self.kv = kv
        # Sharing, prefix hits and swapping: the paged layout's alone (None for contiguous).
        self.paged = kv if isinstance(kv, PagedKVManager) else None
        # Decides each step (``EnginePlugins.scheduler_policy``); the package's is schedule_fcfs.
        self.policy: Callable[[Scheduler], ScheduledBatch] = policy or Scheduler.schedule_fcfs
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.stop = stop
        self.swap = preemption_mode == "swap"
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self.swapped: deque[list[Sequence]] = deque()  # units in host memory, oldest first
        self.tx: StepTransaction | None = None  # the step in flight: scheduled, not yet postprocessed
        self.num_preemptions = 0
        self.num_prefill_tokens_computed = 0  # prompts, chunks and recomputation: every token but decodes
        self.num_prefix_hit_tokens = 0  # prompt tokens served by the cache at first admission
        self.num_resumed_hit_tokens = 0  # tokens a resumed (preempted) request found cached
        # Called with each batch once its K/V are written and its tokens counted, before the
        # sampled tokens are applied and finished sequences let go of their blocks: the memory
        # a step holds at its fullest. What watches the engine (the paper's per-step figures)
        # hooks in here (``LLM.step_hooks``), so the engine carries no recording code.
        self.step_hooks: list[Callable[[ScheduledBatch], None]] = []

    def sharing(self) -> PagedKVManager:
        """The paged manager, for what only it does (fork, swap); input checks keep the rest away."""
        if self.paged is None:
            raise RuntimeError("forking and swapping need kv_layout='paged'")
        return self.paged

    def add(self, group: RequestGroup) -> None:
        """Queue a request's sequences (those its group starts with)."""
        self.waiting.extend(group.queue())

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def running_units(self) -> list[list[Sequence]]:
        """The running sequences as units, in admission order."""
        seen: set[int] = set()
        units = []
        for s in self.running:
            if s.seq_id not in seen:
                unit = s.group.unit(s)
                seen.update(m.seq_id for m in unit)
                units.append(unit)
        return units

    # -- before the step -------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """The step's batch, as the policy decides it."""
        return self.policy(self)

    def transaction(self) -> StepTransaction:
        """The step in flight (begun by the first decision a step makes)."""
        if self.tx is None:
            self.tx = StepTransaction(self.kv.table_block_size, self.paged.prefix_cache if self.paged else None)
        return self.tx

    def schedule_fcfs(self) -> ScheduledBatch:
        """The package's policy (the module docstring): running first, newest preempted, FIFO admission."""
        tx = self.transaction()
        budget = self._schedule_running(tx, self.max_num_batched_tokens)
        if not tx.batch.preempted:  # resume or admit only when nothing had to be preempted: memory is tight
            taken = sum(unit[0].group.seats(unit) for unit in self.running_units())
            budget, taken = self._resume_swapped(tx, budget, taken)
            self._admit_waiting(tx, budget, taken)
        return tx.batch

    def _schedule_running(self, tx: StepTransaction, budget: int) -> int:
        """Room for every running unit, oldest first, preempting the newest while it does not fit."""
        handled: set[int] = set()  # members of units already scheduled (a beam search by its first beam)
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not Status.RUNNING or seq.seq_id in handled:  # preempted, or ran with its unit
                continue
            unit = seq.group.unit(seq)
            handled.update(s.seq_id for s in unit)
            plan = seq.group.plan(unit, [s.num_computed_tokens for s in unit], budget)
            if plan is None:
                continue
            while not self.kv.can_schedule(unit, plan):
                self._preempt(self.running[-1].group.unit(self.running[-1]), tx)
                if seq.status is not Status.RUNNING:
                    break
            else:
                budget -= self._add_to_batch(unit, plan, tx)
        return budget

    def _resume_swapped(self, tx: StepTransaction, budget: int, taken: int) -> tuple[int, int]:
        """Swapped units come back, oldest first, while seats, budget and device memory allow."""
        while self.swapped and budget > 0:
            unit = self.swapped[0]
            group = unit[0].group
            plan = group.plan(unit, [s.num_computed_tokens for s in unit], budget)
            if taken + group.seats(unit) > self.max_num_seqs or plan is None:
                break
            if not self.sharing().can_swap_in(unit, plan):
                break
            self.swapped.popleft()
            tx.batch.blocks_to_swap_in += self.sharing().swap_in(unit)
            self.start(unit)
            taken += group.seats(unit)
            budget -= self._add_to_batch(unit, plan, tx)
        return budget, taken

    def _admit_waiting(self, tx: StepTransaction, budget: int, taken: int) -> None:
        """Waiting units are admitted in FIFO order, each with its prefix hit, while they fit."""
        while self.waiting and not self.swapped and budget > 0:
            unit = self.waiting[0].group.unit(self.waiting[0])
            group = unit[0].group
            if taken + group.seats(unit) > self.max_num_seqs:
                break
            hits = [self.paged.prefix_hit(s, tx) if self.paged else PrefixHit() for s in unit]
            plan = group.plan(unit, [len(h.blocks) * self.kv.table_block_size for h in hits], budget)
            if plan is None:
                break
            fits = self.paged.can_admit(unit, hits, plan) if self.paged else self.kv.can_schedule(unit, plan)
            if not fits:
                break  # the unit waits, and nothing changed
            for s, hit in zip(unit, hits):
                self.waiting.popleft()
                self._take_hit(s, hit, tx, held=False)
            self.start(unit)
            taken += group.seats(unit)
            budget -= self._add_to_batch(unit, plan, tx)

    def _take_hit(self, seq: Sequence, hit: PrefixHit, tx: StepTransaction, held: bool) -> None:
        """Admitted ``seq`` takes its prefix hit (``held``: already taken by :meth:`match_waiting`)."""
        tokens = 0
        if self.paged:
            if not held:
                self.paged.hold(hit)
            tokens = self.paged.attach(seq, hit)
        seq.num_computed_tokens = tokens
        if seq.num_cached_tokens is None:  # the first admission only (a resume reuses its own blocks)
            seq.num_cached_tokens = tokens
            self.num_prefix_hit_tokens += tokens
            tx.first_admitted.append(seq)
        else:  # counted apart, as vLLM does: a preempted request finding its own blocks again
            self.num_resumed_hit_tokens += tokens

    def match_waiting(self, seq: Sequence) -> int:
        """Take waiting ``seq``'s prefix-cache hit before a policy decides, held by the step's
        transaction (its blocks are no longer free); returns the tokens hit. :meth:`carry_out`
        gives it to ``seq`` if the policy admits it, and back to the pool if not."""
        if seq.status is not Status.WAITING or seq.group.unit(seq) != [seq]:
            raise ValueError(f"sequence {seq.seq_id} is not a waiting single sequence")
        tx = self.transaction()
        if seq.seq_id not in tx.held:
            hit = self.paged.prefix_hit(seq, tx) if self.paged else PrefixHit()
            if self.paged:
                self.paged.hold(hit)
            tx.held[seq.seq_id] = (seq, hit)
        return len(tx.held[seq.seq_id][1].blocks) * self.kv.table_block_size

    def carry_out(self, scheduled: list[tuple[Sequence, int]], preempted: list[Sequence]) -> ScheduledBatch:
        """The batch of a policy's decisions: held hits of waiting sequences left out go back;
        then ``preempted`` are preempted (in order, by swap or recompute as the package's policy
        would), and each ``(seq, n)`` of ``scheduled`` gets room for ``n`` new tokens, admitted
        (with its held hit) if it was waiting. Single sequences only (no beams).
        """
        tx = self.transaction()
        chosen = {seq.seq_id for seq, _ in scheduled}
        for seq_id, (_, hit) in list(tx.held.items()):
            if seq_id not in chosen and self.paged:
                self.paged.release(hit)
                del tx.held[seq_id]
        for seq in preempted:
            if seq.status is not Status.RUNNING:
                raise ValueError(f"sequence {seq.seq_id} is not running: it cannot be preempted")
            self._preempt([seq], tx)
        for seq, n in scheduled:
            if seq.status is Status.WAITING:
                self.waiting.remove(seq)
                held = tx.held.pop(seq.seq_id, None)
                self._take_hit(seq, held[1] if held else PrefixHit(), tx, held=held is not None)
                self.start([seq])
            elif seq.status is not Status.RUNNING:
                raise ValueError(f"sequence {seq.seq_id} is {seq.status.name}: it cannot be scheduled")
            self._add_to_batch([seq], [n], tx)
        return tx.batch

    def start(self, unit: list[Sequence]) -> None:
        for s in unit:
            s.status = Status.RUNNING
            self.running.append(s)

    def _add_to_batch(self, unit: list[Sequence], plan: list[int], tx: StepTransaction) -> int:
        """Give each member room for its new tokens and a row in the batch; returns the tokens."""
        for s, n in zip(unit, plan):
            if n:
                self.kv.allocate(s, n, tx)
                tx.add(s, n, self.kv.block_ids(s, s.num_computed_tokens + n))
        return sum(plan)

    def _preempt(self, unit: list[Sequence], tx: StepTransaction) -> None:
        """Swap the unit out if host memory has room; else free it, to be recomputed later."""
        for s in unit:
            self.running.remove(s)
        if self.swap and self.paged and self.paged.can_swap_out(unit):
            tx.batch.blocks_to_swap_out += self.paged.swap_out(unit)
            for s in unit:
                s.status = Status.SWAPPED
            self.swapped.append(unit)
            tx.batch.swapped_out += unit
        else:
            self._requeue(unit)
        tx.batch.preempted += unit
        self.num_preemptions += 1

    def _requeue(self, unit: list[Sequence]) -> None:
        """Free the unit's blocks and put it at the front of the waiting queue, to recompute."""
        for s in reversed(unit):
            self.kv.free(s)
            s.status = Status.WAITING
            s.num_computed_tokens = 0  # everything is recomputed on resumption
            self.waiting.appendleft(s)

    # -- after the step --------------------------------------------------------------------
    def postprocess(self, batch: ScheduledBatch, sampled: SamplerOutput) -> list[Sequence]:
        """The batch ran: count its tokens, commit, keep the prompt logprobs it computed, and let
        each group that sampled take its outcome (fork, append, choose beams, stop). Returns the
        sequences that moved on (beams: the group's live and pruned ones)."""
        for seq, n, decode in zip(batch.seqs, batch.q_lens, batch.decode):
            if not decode:
                self.num_prefill_tokens_computed += n
            seq.num_computed_tokens += n
        self.transaction().commit()  # the forward wrote the step's K/V: its filled blocks are published
        for row, entries in sampled.prompt_logprobs.items():
            batch.seqs[row].group.receive_prompt(entries)
        self.kv.mark_written()
        for hook in self.step_hooks:
            hook(batch)
        groups = list(dict.fromkeys(seq.group for _, seq in batch.samples))
        # Fork first, apply tokens after: a parent whose first token stops it is freed below, and
        # a sibling forked after that would share an empty block table.
        sampled_by = {seq.seq_id for _, seq in batch.samples}
        for group in groups:
            group.fork(self, sampled_by)
        progressed: list[Sequence] = []
        for i, (_, seq) in enumerate(batch.samples):
            progressed += seq.group.receive(self, seq, sampled, i)
        for group in groups:
            progressed += group.settle(self)
        self.tx = None
        return progressed

    def fork(self, parent: Sequence, child: Sequence, at: int | None = None) -> None:
        """``child`` shares every block of ``parent`` and runs (at index ``at`` of the running list, or last)."""
        self.sharing().fork(parent, child)
        child.status = Status.RUNNING
        self.running.insert(len(self.running) if at is None else at, child)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        self.running.remove(seq)
        self.kv.free(seq)

    # -- when a step fails, or a request is dropped ----------------------------------------
    def rollback(self) -> list[int]:
        """Undo the step in flight: every unit it ran or moved goes back to wait, to be
        recomputed. Returns the requests that ran in it."""
        tx, self.tx = self.tx, None
        if tx is None:
            return []
        self.num_prefix_hit_tokens -= sum(s.num_cached_tokens or 0 for s in tx.first_admitted)
        tx.rollback()
        for _, hit in tx.held.values():  # hits a policy took and never placed
            if self.paged:
                self.paged.release(hit)
        touched: list[list[Sequence]] = []
        for s in tx.batch.seqs + tx.batch.swapped_out:
            unit = s.group.unit(s)
            if unit not in touched:
                touched.append(unit)
        for unit in reversed(touched):  # oldest ends up first in the queue
            if unit in self.swapped:  # its K/V may never have reached host memory
                self.swapped.remove(unit)
            elif unit[0].status is Status.RUNNING:
                for s in unit:
                    self.running.remove(s)
            else:
                continue  # preempted by recompute this step: already waiting
            self._requeue(unit)
        return tx.failed_request_ids

    def abort(self, seqs: list[Sequence]) -> None:
        """Drop unfinished sequences wherever they are (finish reason ``"abort"``), freeing their blocks."""
        for seq in seqs:
            if seq.status is Status.FINISHED:
                continue
            if seq.status is Status.RUNNING:
                self.running.remove(seq)
            elif seq.status is Status.SWAPPED:
                self.swapped = deque(u for u in self.swapped if seq not in u)
            elif seq in self.waiting:
                self.waiting.remove(seq)
            self.kv.free(seq)
            seq.status = Status.FINISHED
            seq.finish_reason = "abort"

    def stats(self) -> dict:
        return dict(
            num_preemptions=self.num_preemptions,
            prefill_tokens_computed=self.num_prefill_tokens_computed,
            prefix_hit_tokens=self.num_prefix_hit_tokens,
            resumed_hit_tokens=self.num_resumed_hit_tokens,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_swapped=sum(len(u) for u in self.swapped),
        )
