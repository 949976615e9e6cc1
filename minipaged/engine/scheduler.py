"""Continuous batching: which sequences run each step, with how many new tokens, and what
happens to them once the step's tokens are sampled.

**Schedule.** Each step every running sequence asks for the tokens it still lacks K/V for (a
decode asks for one; a prompt, or a sequence resumed after preemption, asks for many and is
prefilled in chunks when the step's token budget is smaller). Running sequences go first,
oldest first; when the pool cannot hold a sequence's new tokens, the most recently admitted one
is preempted: swapped to host memory (``preemption_mode="swap"``, while the host pool has room)
or freed, to be recomputed later, and put back at the front of the waiting queue. Swapped
sequences come back before waiting ones are admitted; waiting ones are admitted in FIFO order
while ``max_num_seqs``, the token budget and free memory allow. The beams of a beam search are
one *unit*: scheduled, preempted and swapped together, stepping in lockstep.

**Postprocess.** After the batch ran, the computed tokens are counted, the blocks the step
filled stay published to the prefix cache, the ``n`` samples of a finished prompt fork from it,
each sampled token is appended, beams are chosen, forked and pruned, and the stop rules finish
what is done, freeing its blocks.

**Rollback.** If anything between ``schedule`` and ``postprocess`` fails, :meth:`rollback`
puts every sequence the step touched back in the waiting queue to be recomputed (see
:meth:`minipaged.LLM.step`): nothing the step published stays published, no owed copy is
replayed, and every seeded sample gets its random draw back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from minipaged.engine.batch import SamplerOutput, ScheduledBatch
from minipaged.engine.beam_search import BeamGroup
from minipaged.engine.kv_manager import KVManager, PagedKVManager
from minipaged.engine.sequence import Sequence, Status
from minipaged.engine.stop import StopChecker


def unit_of(seq: Sequence) -> list[Sequence]:
    """The sequences scheduled together with ``seq``: its beam search's live beams, or itself."""
    return list(seq.beam.live) if seq.beam is not None else [seq]


def seats(unit: list[Sequence]) -> int:
    """Places in ``max_num_seqs`` a unit takes: ``n`` for a prompt whose samples fork later."""
    return unit[0].params.n if unit[0].beam is not None or unit[0].fork_pending else len(unit)


def lockstep_plan(unit: list[Sequence], budget: int) -> list[int] | None:
    """New tokens per member this step. A beam search samples only when every beam reaches its
    last token in the same step, so a beam stops one short of it until all can finish together."""
    need = [len(s) - s.num_computed_tokens for s in unit]
    if len(unit) == 1:
        return [min(need[0], budget)]
    if sum(need) <= budget:
        return need
    share = budget // len(unit)
    plan = [min(r - 1, share) for r in need]
    return plan if sum(plan) else None


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
        # Sharing, prefix matching and swapping: the paged layout's alone (None for contiguous).
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
        self.in_flight: ScheduledBatch | None = None  # scheduled, not yet postprocessed
        self.num_preemptions = 0
        self.num_prefill_tokens_computed = 0  # prompts, chunks and recomputation: every token but decodes
        self.num_prefix_hit_tokens = 0
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

    def add(self, seqs: list[Sequence]) -> None:
        """Queue a request's sequences (only the first, if the others fork from it later)."""
        self.waiting.extend(seqs[:1] if seqs[0].fork_pending else seqs)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # -- before the step -------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """The step's batch, as the policy decides it."""
        return self.policy(self)

    def schedule_fcfs(self) -> ScheduledBatch:
        """The package's policy (the module docstring): running first, newest preempted, FIFO admission."""
        batch = self.in_flight = ScheduledBatch(block_size=self.kv.table_block_size)
        budget = self.max_num_batched_tokens
        stepped: set[int] = set()  # beam searches already scheduled (by any of their beams)
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not Status.RUNNING or id(seq.beam) in stepped:  # preempted, or ran with its beams
                continue
            if seq.beam is not None:
                stepped.add(id(seq.beam))
            unit = unit_of(seq)
            plan = lockstep_plan(unit, budget)
            if plan is None:
                continue
            while not self.kv.can_schedule(unit, plan):
                self._preempt(unit_of(self.running[-1]), batch)
                if seq.status is not Status.RUNNING:
                    break
            else:
                budget -= self._add_to_batch(unit, plan, batch)
        # Resume or admit only when nothing had to be preempted: memory is tight otherwise.
        taken = sum(seats(unit_of(s)) for s in self.running if s.beam is None or s is s.beam.live[0])
        while self.swapped and not batch.preempted and budget > 0:
            unit = self.swapped[0]
            plan = lockstep_plan(unit, budget)
            if taken + seats(unit) > self.max_num_seqs or plan is None or not self.sharing().can_swap_in(unit, plan):
                break
            self.swapped.popleft()
            batch.blocks_to_swap_in += self.sharing().swap_in(unit)
            self._start(unit)
            taken += seats(unit)
            budget -= self._add_to_batch(unit, plan, batch)
        while self.waiting and not self.swapped and not batch.preempted and budget > 0:
            unit = unit_of(self.waiting[0])
            if taken + seats(unit) > self.max_num_seqs:
                break
            hits = [self.paged.match_prefix(s) if self.paged else 0 for s in unit]
            for s, hit in zip(unit, hits):
                s.num_computed_tokens = s.num_cached_tokens = hit
            plan = lockstep_plan(unit, budget)
            if plan is None or not self.kv.can_schedule(unit, plan):
                for s in unit:  # give the hits back: the unit waits, nothing changed
                    self.kv.free(s)
                    s.num_computed_tokens = s.num_cached_tokens = 0
                break
            for _ in unit:
                self.waiting.popleft()
            self._start(unit)
            self.num_prefix_hit_tokens += sum(hits)
            taken += seats(unit)
            budget -= self._add_to_batch(unit, plan, batch)
        return batch

    def match_waiting(self, seq: Sequence) -> int:
        """Give waiting ``seq`` its prefix-cache hit before a policy decides (its
        ``num_computed_tokens`` then counts the hit); returns the tokens hit. :meth:`carry_out`
        gives the hit back if the policy leaves ``seq`` waiting."""
        if seq.status is not Status.WAITING or seq.beam is not None:
            raise ValueError(f"sequence {seq.seq_id} is not a waiting single sequence")
        if not seq.num_computed_tokens:
            seq.num_computed_tokens = seq.num_cached_tokens = self.paged.match_prefix(seq) if self.paged else 0
        return seq.num_computed_tokens

    def carry_out(self, scheduled: list[tuple[Sequence, int]], preempted: list[Sequence]) -> ScheduledBatch:
        """The batch of a policy's decisions: waiting sequences left out give back any prefix hit
        :meth:`match_waiting` gave them; then ``preempted`` are preempted (in order, by swap or
        recompute as the package's policy would), and each ``(seq, n)`` of ``scheduled`` gets room
        for ``n`` new tokens, admitted if it was waiting. Single sequences only (no beams).
        """
        batch = self.in_flight = ScheduledBatch(block_size=self.kv.table_block_size)
        chosen = {id(seq) for seq, _ in scheduled}
        for s in self.waiting:
            if s.num_computed_tokens and id(s) not in chosen:
                self.kv.free(s)
                s.num_computed_tokens = s.num_cached_tokens = 0
        for seq in preempted:
            if seq.status is not Status.RUNNING:
                raise ValueError(f"sequence {seq.seq_id} is not running: it cannot be preempted")
            self._preempt([seq], batch)
        for seq, n in scheduled:
            if seq.status is Status.WAITING:
                self.waiting.remove(seq)
                self.num_prefix_hit_tokens += seq.num_cached_tokens
                self._start([seq])
            elif seq.status is not Status.RUNNING:
                raise ValueError(f"sequence {seq.seq_id} is {seq.status.name}: it cannot be scheduled")
            self._add_to_batch([seq], [n], batch)
        return batch

    def _start(self, unit: list[Sequence]) -> None:
        for s in unit:
            s.status = Status.RUNNING
            self.running.append(s)

    def _add_to_batch(self, unit: list[Sequence], plan: list[int], batch: ScheduledBatch) -> int:
        """Give each member room for its new tokens and a row in the batch; returns the tokens."""
        for s, n in zip(unit, plan):
            if n:
                batch.blocks_to_copy += self.kv.allocate(s, n)
                batch.add(s, n, self.kv.block_ids(s, s.num_computed_tokens + n))
        return sum(plan)

    def _preempt(self, unit: list[Sequence], batch: ScheduledBatch) -> None:
        """Swap the unit out if host memory has room; else free it, to be recomputed later."""
        for s in unit:
            self.running.remove(s)
        if self.swap and self.paged and self.paged.can_swap_out(unit):
            batch.blocks_to_swap_out += self.paged.swap_out(unit)
            for s in unit:
                s.status = Status.SWAPPED
            self.swapped.append(unit)
            batch.swapped_out += unit
        else:
            self._requeue(unit)
        batch.preempted += unit
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
        """The batch ran: count its tokens, fork, append the sampled tokens, choose beams, stop.
        Returns the sequences that got a new token (beams: the group's live and pruned ones)."""
        for seq, n, decode in zip(batch.seqs, batch.q_lens, batch.decode):
            if not decode:
                self.num_prefill_tokens_computed += n
            seq.num_computed_tokens += n
        self.kv.mark_written()  # what the step published holds K/V now
        for hook in self.step_hooks:
            hook(batch)
        progressed: list[Sequence] = []
        beams: dict[BeamGroup, list[list[tuple[int, float]]]] = {}
        # Fork first, apply tokens after: a parent whose first token stops it is freed below, and
        # a sibling forked after that would share an empty block table.
        for row, seq in batch.samples:
            if seq.beam is None and seq.status is Status.WAITING:  # forks from its parent's finished prompt
                parent = batch.seqs[row]
                parent.fork_pending = False
                self.sharing().fork(parent, seq)
                seq.num_computed_tokens = parent.num_computed_tokens
                seq.num_cached_tokens = parent.num_cached_tokens
                self._start([seq])
        for i, (_, seq) in enumerate(batch.samples):
            if seq.beam is not None:
                beams.setdefault(seq.beam, []).append(sampled.candidates[i])
                continue
            seq.token_ids.append(sampled.token_ids[i])
            reason = self.stop.check(seq)
            if reason is not None:
                self._finish(seq, reason)
            progressed.append(seq)
        for group, candidates in beams.items():
            progressed += self._step_beams(group, candidates)
        self.in_flight = None
        return progressed

    def _step_beams(self, group: BeamGroup, candidates: list[list[tuple[int, float]]]) -> list[Sequence]:
        """Apply the group's choice: a beam chosen k times forks k - 1 times, one not chosen is
        pruned (its blocks freed at once). Returns every beam that was live."""
        old = list(group.live)
        chosen = group.select(candidates)
        children: dict[int, list[tuple[int, float]]] = {}
        for parent, token, cum in chosen:
            children.setdefault(parent, []).append((token, cum))
        new_live: dict[tuple[int, int], Sequence] = {}
        for i, beam in enumerate(old):
            picks = children.get(i, [])
            if not picks:
                self._finish(beam, "pruned")
                continue
            at = self.running.index(beam) + 1
            for k, (token, cum) in enumerate(picks[1:], start=1):
                child = beam.branch()
                self.sharing().fork(beam, child)
                self.running.insert(at, child)  # beside its parent: a unit stays together
                child.token_ids.append(token)
                child.cum_logprob = cum
                new_live[i, k] = child
            beam.token_ids.append(picks[0][0])
            beam.cum_logprob = picks[0][1]
            new_live[i, 0] = beam
        seen: dict[int, int] = {}
        group.live = []
        for parent, _, _ in chosen:  # best first
            k = seen[parent] = seen.get(parent, -1) + 1
            group.live.append(new_live[parent, k])
        if group.done:
            group.final = group.result()
            for beam in group.live:
                self._finish(beam, "length")
        return old

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        self.running.remove(seq)
        self.kv.free(seq)

    # -- when a step fails, or a request is dropped ----------------------------------------
    def rollback(self) -> list[Sequence]:
        """Undo the step in flight: every unit it ran or moved goes back to wait, to be
        recomputed. Returns the sequences that ran in it."""
        batch, self.in_flight = self.in_flight, None
        if batch is None:
            return []
        if self.paged:
            self.paged.drop_unwritten()
        for generator, state in batch.rng_states:
            generator.set_state(state)
        touched: list[list[Sequence]] = []
        for s in batch.seqs + batch.swapped_out:
            unit = unit_of(s)
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
        return list(batch.seqs)

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
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_swapped=sum(len(u) for u in self.swapped),
        )
