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
:class:`BeamGroup` decides; the scheduler forks, prunes and frees.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from minipaged.engine.sampling_params import BeamSearchParams
from minipaged.engine.sequence import Sequence


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


class BeamGroup:
    """The state of one beam search: its live beams (best first) and its finished ones."""

    def __init__(self, params: BeamSearchParams, first: Sequence, eos_token_ids: Collection[int]) -> None:
        self.params = params
        self.eos = frozenset(eos_token_ids)
        self.live: list[Sequence] = [first]
        self.completed: list[BeamSearchSequence] = []
        self.num_steps = 0
        self.num_prompt_tokens = first.num_prompt_tokens
        self.final: list[BeamSearchSequence] | None = None  # the answer, once done
        first.beam = self

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
