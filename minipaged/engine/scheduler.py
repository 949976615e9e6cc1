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

**After the step** the runner's :class:`~minipaged.engine.runner_output.ModelRunnerOutput` comes
back in two calls. :meth:`commit`: the computed tokens are counted, the step's transaction
commits (the blocks it filled reach the prefix cache), the prompt logprobs it computed are kept.
:meth:`update_from_output`: each group that sampled says what happens, in three phases — new
samples fork from their finished prompt, each row's token is appended in row order (the stop
rules finish what is done), beam searches choose, fork and prune their beams — as data
(:mod:`~minipaged.engine.decisions`), and :meth:`apply` carries out each decision: the one
place that moves sequences between queues and frees their blocks after a step.

The KV memory is one door (:class:`~minipaged.engine.kv_cache_manager.KVCacheManager`): the
scheduler never asks which layout is behind it.

**Rollback.** If anything between ``schedule`` and ``postprocess`` fails, :meth:`rollback`
puts every unit the step touched back in the waiting queue to be recomputed (see
:meth:`minipaged.LLM.step`): nothing the step filled is published, no owed copy is replayed,
and every seeded sample gets its random draw back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from minipaged.engine.decisions import Append, Decision, Finish, Fork
from minipaged.engine.kv_cache_manager import KVCacheManager
from minipaged.engine.prefix_hit import PrefixHit
from minipaged.engine.request_group import RequestGroup
from minipaged.engine.runner_output import ModelRunnerOutput
from minipaged.engine.scheduler_output import SchedulerOutput
from minipaged.engine.sequence import Sequence, Status
from minipaged.engine.step_transaction import StepTransaction
from minipaged.engine.stop_checker import StopChecker


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        stop: StopChecker,
        preemption_mode: str = "recompute",
        policy: Callable[[Scheduler], SchedulerOutput] | None = None,
    ) -> None:
        self.kv = kv
        # Decides each step (``EnginePlugins.scheduler_policy``); the package's is schedule_fcfs.
        self.policy: Callable[[Scheduler], SchedulerOutput] = policy or Scheduler.schedule_fcfs
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
        self.groups: dict[int, RequestGroup] = {}  # seq_id -> its request's group, while it is unfinished

    def add(self, group: RequestGroup) -> None:
        """Queue a request's sequences (those its group starts with)."""
        self.groups.update((s.seq_id, group) for s in group.seqs)
        self.waiting.extend(group.queue())

    def group_of(self, seq: Sequence) -> RequestGroup:
        """The request group ``seq`` belongs to (a sequence holds no pointer up)."""
        return self.groups[seq.seq_id]

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def running_units(self) -> list[list[Sequence]]:
        """The running sequences as units, in admission order."""
        seen: set[int] = set()
        units = []
        for s in self.running:
            if s.seq_id not in seen:
                unit = self.group_of(s).unit(s)
                seen.update(m.seq_id for m in unit)
                units.append(unit)
        return units

    # -- before the step -------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """The step's :class:`SchedulerOutput`, as the policy decides it."""
        return self.policy(self)

    def transaction(self) -> StepTransaction:
        """The step in flight (begun by the first decision a step makes)."""
        if self.tx is None:
            self.tx = StepTransaction(self.kv.table_block_size, self.kv.prefix_cache)
        return self.tx

    def schedule_fcfs(self) -> SchedulerOutput:
        """The package's policy (the module docstring): running first, newest preempted, FIFO admission."""
        tx = self.transaction()
        budget = self._schedule_running(tx, self.max_num_batched_tokens)
        if not tx.batch.preempted:  # resume or admit only when nothing had to be preempted: memory is tight
            taken = sum(self.group_of(unit[0]).seats(unit) for unit in self.running_units())
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
            unit = self.group_of(seq).unit(seq)
            handled.update(s.seq_id for s in unit)
            plan = self.group_of(seq).plan(unit, [s.num_computed_tokens for s in unit], budget)
            if plan is None:
                continue
            while not self.kv.can_schedule(unit, plan):
                self._preempt(self.group_of(self.running[-1]).unit(self.running[-1]), tx)
                if seq.status is not Status.RUNNING:
                    break
            else:
                budget -= self._add_to_batch(unit, plan, tx)
        return budget

    def _resume_swapped(self, tx: StepTransaction, budget: int, taken: int) -> tuple[int, int]:
        """Swapped units come back, oldest first, while seats, budget and device memory allow."""
        while self.swapped and budget > 0:
            unit = self.swapped[0]
            group = self.group_of(unit[0])
            plan = group.plan(unit, [s.num_computed_tokens for s in unit], budget)
            if taken + group.seats(unit) > self.max_num_seqs or plan is None:
                break
            if not self.kv.can_swap_in(unit, plan):
                break
            self.swapped.popleft()
            tx.batch.blocks_to_swap_in += self.kv.swap_in(unit)
            self.start(unit)
            taken += group.seats(unit)
            budget -= self._add_to_batch(unit, plan, tx)
        return budget, taken

    def _admit_waiting(self, tx: StepTransaction, budget: int, taken: int) -> None:
        """Waiting units are admitted in FIFO order, each with its prefix hit, while they fit."""
        while self.waiting and not self.swapped and budget > 0:
            group = self.group_of(self.waiting[0])
            unit = group.unit(self.waiting[0])
            if taken + group.seats(unit) > self.max_num_seqs:
                break
            hits = [self._computed_blocks(s, tx) for s in unit]
            plan = group.plan(unit, [len(h.blocks) * self.kv.table_block_size for h in hits], budget)
            if plan is None:
                break
            if not self.kv.can_admit(unit, hits, plan):
                break  # the unit waits, and nothing changed
            for s, hit in zip(unit, hits):
                self.waiting.popleft()
                self._take_hit(s, hit, tx, held=False)
            self.start(unit)
            taken += group.seats(unit)
            budget -= self._add_to_batch(unit, plan, tx)

    def _take_hit(self, seq: Sequence, hit: PrefixHit, tx: StepTransaction, held: bool) -> None:
        """Admitted ``seq`` takes its prefix hit (``held``: already taken by :meth:`match_waiting`)."""
        if not held:
            self.kv.hold(hit)
        tokens = self.kv.attach(seq, hit)
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
        if seq.status is not Status.WAITING or self.group_of(seq).unit(seq) != [seq]:
            raise ValueError(f"sequence {seq.seq_id} is not a waiting single sequence")
        tx = self.transaction()
        if seq.seq_id not in tx.held:
            hit = self._computed_blocks(seq, tx)
            self.kv.hold(hit)
            tx.held[seq.seq_id] = (seq, hit)
        return len(tx.held[seq.seq_id][1].blocks) * self.kv.table_block_size

    def _computed_blocks(self, seq: Sequence, tx: StepTransaction) -> PrefixHit:
        """Waiting ``seq``'s prefix hit, found without changing anything."""
        return self.kv.get_computed_blocks(seq, tx, self.group_of(seq).prompt_logprobs is not None)

    def carry_out(self, scheduled: list[tuple[Sequence, int]], preempted: list[Sequence]) -> SchedulerOutput:
        """The batch of a policy's decisions: held hits of waiting sequences left out go back;
        then ``preempted`` are preempted (in order, by swap or recompute as the package's policy
        would), and each ``(seq, n)`` of ``scheduled`` gets room for ``n`` new tokens, admitted
        (with its held hit) if it was waiting. Single sequences only (no beams).
        """
        tx = self.transaction()
        chosen = {seq.seq_id for seq, _ in scheduled}
        for seq_id, (_, hit) in list(tx.held.items()):
            if seq_id not in chosen:
                self.kv.release(hit)
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
        group = self.group_of(unit[0])
        for s, n in zip(unit, plan):
            if n:
                self.kv.allocate_slots(s, n, tx)
                table = self.kv.block_ids(s, s.num_computed_tokens + n)
                tx.add(s, n, table, group.samplers(s), group.num_candidates, group.scored_prompt(s, n))
        return sum(plan)

    def _preempt(self, unit: list[Sequence], tx: StepTransaction) -> None:
        """Swap the unit out if host memory has room; else free it, to be recomputed later."""
        for s in unit:
            self.running.remove(s)
        if self.swap and self.kv.can_swap_out(unit):
            tx.batch.blocks_to_swap_out += self.kv.swap_out(unit)
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
    def commit(self, batch: SchedulerOutput, sampled: ModelRunnerOutput) -> None:
        """The forward wrote the step's K/V: count its tokens, publish the blocks it filled, keep
        the prompt logprobs it computed. Memory is at its fullest now (nothing freed yet)."""
        for seq, n, decode in zip(batch.seqs, batch.q_lens, batch.decode):
            if not decode:
                self.num_prefill_tokens_computed += n
            seq.num_computed_tokens += n
        self.transaction().commit()
        for row, entries in sampled.prompt_logprobs.items():
            self.group_of(batch.seqs[row]).receive_prompt(entries)
        self.kv.mark_written()

    def update_from_output(self, batch: SchedulerOutput, sampled: ModelRunnerOutput) -> list[Decision]:
        """Each group that sampled decides (forks, then each row's token in row order, then a
        beam search's choice), and each decision is applied as it comes. Returns them all."""
        groups = list(dict.fromkeys(self.group_of(seq) for _, seq in batch.samples))
        # Fork first, apply tokens after: a parent whose first token stops it is freed below, and
        # a sibling forked after that would share an empty block table.
        sampled_by = {seq.seq_id for _, seq in batch.samples}
        decisions = [d for group in groups for d in self.apply(group, group.forks(sampled_by))]
        for i, (_, seq) in enumerate(batch.samples):
            group = self.group_of(seq)
            decisions += self.apply(group, group.receive(seq, sampled, i, self.stop))
        for group in groups:
            decisions += self.apply(group, group.settle())
        self.tx = None
        return decisions

    def postprocess(self, batch: SchedulerOutput, sampled: ModelRunnerOutput) -> list[Sequence]:
        """:meth:`commit` then :meth:`update_from_output`; returns the sequences that sampled."""
        self.commit(batch, sampled)
        self.update_from_output(batch, sampled)
        return [seq for _, seq in batch.samples]

    def apply(self, group: RequestGroup, decisions: list[Decision]) -> list[Decision]:
        """Carry out ``group``'s decisions, in order (:mod:`~minipaged.engine.decisions`)."""
        for d in decisions:
            if isinstance(d, Append):
                d.seq.token_ids.append(d.token)
                if d.entry is not None and d.seq.logprobs is not None:
                    d.seq.logprobs.extend([d.entry])
                if d.cum_logprob is not None:
                    d.seq.cum_logprob = d.cum_logprob
            elif isinstance(d, Fork):
                self.kv.fork(d.parent, d.child)
                d.child.num_computed_tokens = d.parent.num_computed_tokens
                d.child.num_cached_tokens = d.parent.num_cached_tokens
                d.child.status = Status.RUNNING
                self.groups[d.child.seq_id] = group
                at = self.running.index(d.parent) + 1 if d.beside else len(self.running)
                self.running.insert(at, d.child)
            else:
                self._finish(d)
        return decisions

    def _finish(self, d: Finish) -> None:
        seq = d.seq
        seq.status, seq.finish_reason = Status.FINISHED, d.reason
        seq.stop_reason = d.stop_reason
        if d.text_len is not None:
            seq.text_len = d.text_len
        self.running.remove(seq)
        self.kv.free(seq)
        del self.groups[seq.seq_id]

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
            self.kv.release(hit)
        touched: list[list[Sequence]] = []
        for s in tx.batch.seqs + tx.batch.swapped_out:
            unit = self.group_of(s).unit(s)
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
            self.groups.pop(seq.seq_id, None)

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
