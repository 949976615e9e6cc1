"""Beam search over shared blocks (the PagedAttention paper's §4.4, vLLM's ``LLM.beam_search`` rule).

A beam search keeps ``beam_width`` live beams of one prompt. Each step every live beam proposes
its ``2 x beam_width`` most likely next tokens; a proposal's ``cum_logprob`` is its beam's plus
the token's log-probability. Proposals ending in an end-of-sequence token (unless
``ignore_eos``) are finished; the ``beam_width`` best of the others live on. After
``max_tokens`` steps, or once no beam lives, finished and live beams are ranked by
``cum_logprob / length ** length_penalty`` (the length counts the prompt, not a final
end-of-sequence token) and the best ``beam_width`` are the answer.

In memory the beams are sequences that share blocks: a beam chosen twice forks (its block table
copied, every block's ``ref_cnt`` up; its partly filled last block is copied on write when the
two children write their different tokens), and a beam nobody chose frees its blocks at once.
:class:`BeamGroup` is the request group of a beam search
(:class:`~minipaged.engine.request_group.RequestGroup`): its live beams are one unit, scheduled,
preempted and swapped together and stepping in lockstep; it decides which beams live on and
says so as data (:mod:`~minipaged.engine.decisions`: fork a chosen beam beside its parent,
append each beam's token, finish a pruned beam), which the scheduler applies.
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

from minipaged.engine.decisions import Append, Decision, Finish, Fork
from minipaged.engine.limits import Limits
from minipaged.engine.request_group import RequestGroup
from minipaged.engine.runner_output import ModelRunnerOutput
from minipaged.engine.sampling_params import BeamSearchParams
from minipaged.engine.sequence import Sequence
from minipaged.engine.stop_checker import StopChecker


@dataclass
class BeamSearchSequence:
    """One answer: ``token_ids`` are the generated tokens (a final end-of-sequence token kept, as
    vLLM keeps it), ``text`` their text without it."""

    token_ids: list[int]
    cum_logprob: float
    finish_reason: str  # "stop" (an end-of-sequence token) or "length"
    text: str = ""


@dataclass
class BeamSearchOutput:
    """The ``beam_width`` best beams of one prompt, best first."""

    sequences: list[BeamSearchSequence]
    request_id: int = -1
    prompt_token_ids: list[int] = field(default_factory=list)


def beam_score(num_tokens: int, last_token: int, cum_logprob: float, eos: Collection[int], penalty: float) -> float:
    """``cum_logprob / length ** penalty``; ``num_tokens`` counts the prompt, and a final
    end-of-sequence token does not count."""
    length = num_tokens - (last_token in eos)
    return cum_logprob / (length**penalty)


def lockstep_plan(need: list[int], budget: int) -> list[int] | None:
    """New tokens per beam, of the ``need`` each still lacks K/V for. A beam search samples only
    when every beam reaches its last token in the same step, so a beam stops one short of it
    until all can finish together."""
    if len(need) == 1:
        return [min(need[0], budget)]
    if sum(need) <= budget:
        return need
    share = budget // len(need)
    plan = [min(r - 1, share) for r in need]
    return plan if sum(plan) else None


class BeamGroup(RequestGroup):
    """The state of one beam search: its live beams (best first) and its finished ones."""

    streams = False
    params: BeamSearchParams

    @classmethod
    def create(
        cls,
        request_id: int,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: Any,
        block_size: int,
        can_fork: bool,
        eos_token_ids: Collection[int],
    ) -> BeamGroup:
        """The group of ``params`` (the kind :func:`~minipaged.engine.inputs.group_class` chose)."""
        return cls(request_id, prompt, prompt_token_ids, params, block_size, eos_token_ids)

    def __init__(
        self,
        request_id: int,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: BeamSearchParams,
        block_size: int,
        eos_token_ids: Collection[int],
    ) -> None:
        first = Sequence(request_id, prompt_token_ids, params, block_size)
        super().__init__(request_id, prompt, prompt_token_ids, params, [first])
        self.num_candidates = 2 * params.beam_width
        self.eos = frozenset(eos_token_ids)
        self.live: list[Sequence] = [first]
        self.completed: list[BeamSearchSequence] = []
        self.num_steps = 0
        self.num_prompt_tokens = first.num_prompt_tokens
        self._final: list[BeamSearchSequence] | None = None  # the answer, once done and applied
        self._candidates: list[list[tuple[int, float]]] = []  # this step's, in ``live`` order

    @staticmethod
    def check(params: Any, index: int, limits: Limits) -> int:
        """Refuse a beam search this engine could never run; returns the beams, since a beam
        search recomputed after preemption holds every beam's blocks."""
        if not limits.can_fork:
            raise ValueError("beam search shares blocks between beams: it needs kv_layout='paged'")
        if params.beam_width > limits.max_num_batched_tokens:
            raise ValueError(
                f"beam_width {params.beam_width} > max_num_batched_tokens {limits.max_num_batched_tokens}: "
                f"the beams of a prompt step together"
            )
        return int(params.beam_width)

    @staticmethod
    def asks_for(params: Any) -> str:
        return f"beam_width={params.n} beams"

    # -- the scheduler's unit --------------------------------------------------------------
    def unit(self, seq: Sequence) -> list[Sequence]:
        return list(self.live)

    def seats(self, unit: list[Sequence]) -> int:
        return self.params.beam_width

    def plan(self, unit: list[Sequence], computed: Seq[int], budget: int) -> list[int] | None:
        return lockstep_plan([len(s) - c for s, c in zip(unit, computed)], budget)

    def members(self) -> list[Sequence]:
        return list(self.live)

    # -- after the step --------------------------------------------------------------------
    def receive(self, seq: Sequence, sampled: ModelRunnerOutput, i: int, stop: StopChecker) -> list[Decision]:
        self._candidates.append(sampled.candidates[i])
        return []

    def settle(self) -> list[Decision]:
        """The choice, as decisions: a beam chosen k times forks k - 1 times (each child beside its
        parent), one not chosen is pruned (its blocks freed at once); once done, the live beams finish."""
        old = list(self.live)
        chosen = self.select(self._candidates)
        self._candidates = []
        children: dict[int, list[tuple[int, float]]] = {}
        for parent, token, cum in chosen:
            children.setdefault(parent, []).append((token, cum))
        decisions: list[Decision] = []
        new_live: dict[tuple[int, int], Sequence] = {}
        for i, beam in enumerate(old):
            picks = children.get(i, [])
            if not picks:
                decisions.append(Finish(beam, "pruned"))
                continue
            for k, (token, cum) in enumerate(picks[1:], start=1):
                child = beam.branch()
                decisions += [Fork(beam, child, beside=True), Append(child, token, cum_logprob=cum)]
                new_live[i, k] = child
            decisions.append(Append(beam, picks[0][0], cum_logprob=picks[0][1]))
            new_live[i, 0] = beam
        seen: dict[int, int] = {}
        self.live = []
        for parent, _, _ in chosen:  # best first
            k = seen[parent] = seen.get(parent, -1) + 1
            self.live.append(new_live[parent, k])
        if self.done:
            decisions += [Finish(beam, "length") for beam in self.live]
        return decisions

    @property
    def final(self) -> list[BeamSearchSequence] | None:
        """The answer (the best ``beam_width``), once the search is done and its last step applied."""
        if self._final is None and self.done and all(s.finish_reason is not None for s in self.live):
            self._final = self.result()
        return self._final

    # -- the rule --------------------------------------------------------------------------
    def _score(self, num_tokens: int, last: int, cum: float) -> float:
        return beam_score(num_tokens, last, cum, self.eos, self.params.length_penalty)

    def select(self, candidates: list[list[tuple[int, float]]]) -> list[tuple[int, int, float]]:
        """Candidates ``[(token, logprob), ...]`` of each live beam (in ``live`` order, most likely
        first) -> the next live beams as ``(index of the parent beam, token, cum_logprob)``, best
        first. Finished proposals are recorded here."""
        proposals = []
        for i, (beam, cands) in enumerate(zip(self.live, candidates)):
            for token, logprob in cands:
                cum = beam.cum_logprob + logprob
                if token in self.eos and not self.params.ignore_eos:
                    self.completed.append(BeamSearchSequence(beam.output_token_ids + [token], cum, "stop"))
                else:
                    proposals.append((i, token, cum))
        n = len(self.live[0]) + 1  # every live beam has the same length
        proposals.sort(key=lambda p: self._score(n, p[1], p[2]), reverse=True)  # stable, as vLLM's sorted()
        self.num_steps += 1
        return proposals[: self.params.beam_width]

    @property
    def done(self) -> bool:
        return not self.live or self.num_steps >= self.params.max_tokens

    def result(self) -> list[BeamSearchSequence]:
        """Finished and live beams ranked; the best ``beam_width``."""
        ranked = self.completed + [BeamSearchSequence(b.output_token_ids, b.cum_logprob, "length") for b in self.live]
        prompt = self.num_prompt_tokens
        ranked.sort(key=lambda s: self._score(prompt + len(s.token_ids), s.token_ids[-1], s.cum_logprob), reverse=True)
        return ranked[: self.params.beam_width]
