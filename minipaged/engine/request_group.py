"""A request group: the scheduler's unit, one per request (vLLM V0's ``SequenceGroup``).

A request asks for ``n`` samples of a prompt (:class:`SampleGroup`) or a beam search over it
(:class:`~minipaged.engine.beam_search.BeamGroup`). Either way the scheduler sees one group,
which answers everything that differs between the two, so that nothing else asks which kind
of request it holds:

- ``queue()``: the sequences that enter the waiting queue when the request is added;
- ``unit(seq)``: the sequences scheduled, preempted and swapped together with ``seq``;
- ``seats(unit)``: the places in ``max_num_seqs`` that unit takes;
- ``plan(unit, computed, budget)``: each member's new tokens this step, within the token budget;
- ``samplers(seq)``: who samples from ``seq``'s row of logits once its step reaches its last token;
- ``scored_prompt(seq, n)``: the prompt tokens whose logprobs ``seq``'s next ``n`` tokens give
  (a request that asked for ``prompt_logprobs``; :mod:`~minipaged.engine.logprobs`), and
  ``receive_prompt`` to keep them;
- ``num_candidates``: 0 when a row draws one token, else the most likely tokens it wants;
- after the step, in three phases over every group that sampled: ``forks`` (new members take
  their parent's blocks), ``receive`` (each row's token, in row order) and ``settle`` (a beam
  search chooses its beams). Each returns its decisions as data
  (:mod:`~minipaged.engine.decisions`: append, fork, finish with the reason), and the scheduler
  applies them: a group never calls the scheduler, nor reads its queues;
- ``members()``, ``finished`` and ``output()``: what is still live, and what is handed back.

**Samples.** On a cache that shares blocks the first sample computes the prompt alone, taking
the ``n`` seats its siblings will need; when its prompt is done the siblings draw their first
token from its row and fork from it (``unforked`` until then), sharing its blocks. From then on
every sample is its own unit. A cache that shares nothing queues all ``n``, each computing the
prompt on its own.

**When a sample stops**: the stop rules (:class:`~minipaged.engine.stop_checker.StopChecker`,
vLLM's) are handed to ``receive``, which returns their :class:`~minipaged.engine.decisions.Finish`
after the token's :class:`~minipaged.engine.decisions.Append`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from collections.abc import Sequence as Seq
from typing import Any

import torch

from minipaged.engine.decisions import Append, Decision, Fork
from minipaged.engine.limits import Limits
from minipaged.engine.logprobs import LogprobsRecord, TokenLogprobs, prompt_positions
from minipaged.engine.outputs import CompletionOutput, RequestOutput
from minipaged.engine.runner_output import ModelRunnerOutput
from minipaged.engine.sampling_params import BeamSearchParams, SamplingParams
from minipaged.engine.sequence import Sequence, Status
from minipaged.engine.stop_checker import StopChecker


class RequestGroup(ABC):
    """What every kind of request shares: its prompt, its sequences, its output.

    ``seqs``: the sequences the request started with, in sample order (a beam search: its first
    beam). The defaults below are a single sequence's; the two kinds override what differs.
    """

    num_candidates = 0  # per sampling row: 0 draws one token; a beam search wants its top candidates
    streams = True  # whether each step's tokens are an output (a beam search answers only at the end)
    prompt_logprobs: LogprobsRecord[TokenLogprobs | None] | None = None  # the prompt's entries, if asked for

    def __init__(
        self,
        request_id: int,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams | BeamSearchParams,
        seqs: list[Sequence],
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.seqs = seqs
        for s in seqs:
            s.group = self

    # -- scheduling ------------------------------------------------------------------------
    def queue(self) -> list[Sequence]:
        return list(self.seqs)

    def unit(self, seq: Sequence) -> list[Sequence]:
        return [seq]

    def seats(self, unit: list[Sequence]) -> int:
        return len(unit)

    def plan(self, unit: list[Sequence], computed: Seq[int], budget: int) -> list[int] | None:
        """New tokens per member of ``unit`` whose members hold ``computed`` tokens; None: none fit."""
        return [min(len(unit[0]) - computed[0], budget)]

    def samplers(self, seq: Sequence) -> list[Sequence]:
        return [seq]

    def scored_prompt(self, seq: Sequence, num_tokens: int) -> tuple[range, int] | None:
        """The positions of the prompt tokens that ``seq``'s next ``num_tokens`` tokens score, and
        how many alternatives each lists; None when they score none (by default, none is asked for)."""
        return None

    # -- after the step --------------------------------------------------------------------
    def forks(self, sampled_by: Collection[int]) -> list[Decision]:
        """New members that share their parent's blocks (``sampled_by``: ids of the step's samplers)."""
        return []  # by default nothing forks here (a beam search forks its beams in ``settle``)

    def receive_prompt(self, entries: list[TokenLogprobs]) -> None:
        """The entries of the prompt tokens a row scored, in order (where :meth:`scored_prompt` said)."""
        assert self.prompt_logprobs is not None  # only a request that asked has its prompt scored
        self.prompt_logprobs.extend(entries)

    @abstractmethod
    def receive(self, seq: Sequence, sampled: ModelRunnerOutput, i: int, stop: StopChecker) -> list[Decision]:
        """What ``seq``'s sample ``i`` of the step does (``stop``: the stop rules)."""

    def settle(self) -> list[Decision]:
        """Once every row is received: what a group decides over all of them."""
        return []

    # -- what is live, what is handed back -------------------------------------------------
    def members(self) -> list[Sequence]:
        """The sequences that may still run (to abort them)."""
        return list(self.seqs)

    @property
    def finished(self) -> bool:
        return all(s.status is Status.FINISHED for s in self.seqs + self.members())

    def output(self, tokenizer: Any) -> RequestOutput:
        """The request's output so far: its samples in order, the text without a stop token, cut
        before a stop string."""
        outs = []
        for s in sorted(self.seqs, key=lambda s: s.sample_index):
            shown = s.output_token_ids
            if s.finish_reason == "stop" and s.text_len is None:
                shown = shown[:-1]
            text = tokenizer.decode(shown) if tokenizer is not None else ""
            if s.text_len is not None:
                text = text[: s.text_len]
            out = CompletionOutput(s.sample_index, text, s.output_token_ids, s.finish_reason, s.stop_reason)
            if s.logprobs is not None:
                out.cumulative_logprob, out.logprobs = s.cum_logprob, s.logprobs.decoded(tokenizer)
            outs.append(out)
        prompt_logprobs = None if self.prompt_logprobs is None else self.prompt_logprobs.decoded(tokenizer)
        cached = self.seqs[0].num_cached_tokens or 0
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs, cached, prompt_logprobs)


def seeded_generator(params: SamplingParams, sample_index: int) -> torch.Generator | None:
    """One random stream per (request seed, sample): independent of batching and preemption."""
    if params.seed is None:
        return None
    return torch.Generator().manual_seed((params.seed * 1_000_003 + sample_index) % 2**64)


class SampleGroup(RequestGroup):
    """``n`` samples of one prompt (see the module docstring); ``can_fork``: the cache shares blocks."""

    params: SamplingParams

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
    ) -> SampleGroup:
        """The group of ``params`` (the kind :func:`~minipaged.engine.inputs.group_class` chose)."""
        return cls(request_id, prompt, prompt_token_ids, params, block_size, can_fork)

    def __init__(
        self,
        request_id: int,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        block_size: int,
        can_fork: bool = True,
    ) -> None:
        seqs = [
            Sequence(request_id, prompt_token_ids, params, block_size, i, seeded_generator(params, i))
            for i in range(params.n)
        ]
        super().__init__(request_id, prompt, prompt_token_ids, params, seqs)
        self.unforked = seqs[1:] if can_fork else []  # fork from seqs[0] once its prompt is done
        if params.prompt_logprobs is not None:
            self.prompt_logprobs = LogprobsRecord([None])  # the first token has nothing before it

    def queue(self) -> list[Sequence]:
        return self.seqs[:1] if self.unforked else list(self.seqs)

    def seats(self, unit: list[Sequence]) -> int:
        return len(unit) + (len(self.unforked) if unit[0] is self.seqs[0] else 0)

    def samplers(self, seq: Sequence) -> list[Sequence]:
        return [seq, *self.unforked] if seq is self.seqs[0] else [seq]

    def scored_prompt(self, seq: Sequence, num_tokens: int) -> tuple[range, int] | None:
        """The first sample scores the prompt (the others share its blocks, or compute the same
        prompt), the tokens not scored yet: a prompt recomputed after preemption is scored once."""
        k, record = self.params.prompt_logprobs, self.prompt_logprobs
        if k is None or record is None or seq is not self.seqs[0]:
            return None
        positions = prompt_positions(len(record), seq.num_computed_tokens, num_tokens, seq.num_prompt_tokens)
        return (positions, k) if positions else None

    def forks(self, sampled_by: Collection[int]) -> list[Decision]:
        if not self.unforked or self.unforked[0].seq_id not in sampled_by:
            return []
        parent, children = self.seqs[0], self.unforked
        self.unforked = []
        return [Fork(parent, child) for child in children]

    @staticmethod
    def check(params: Any, index: int, limits: Limits) -> int:
        """Refuse sampling params (``params``: the kind :func:`~minipaged.engine.inputs.group_class`
        chose this group for) this engine could never serve; returns the sequences whose blocks
        the request may hold at once."""
        if params.stop and not limits.has_tokenizer:
            raise ValueError(f"prompt {index}: stop strings need a tokenizer; this model has none (use stop_token_ids)")
        bad = [t for t in params.stop_token_ids or () if t >= limits.vocab_size]
        if bad:
            raise ValueError(f"prompt {index}: stop_token_ids outside the vocabulary [0, {limits.vocab_size}): {bad}")
        return 1

    @staticmethod
    def asks_for(params: Any) -> str:
        return f"n={params.n} samples"

    def receive(self, seq: Sequence, sampled: ModelRunnerOutput, i: int, stop: StopChecker) -> list[Decision]:
        token = sampled.token_ids[i]
        append = Append(seq, token)
        if seq.logprobs is not None:
            append.entry = sampled.logprobs[i]
            append.cum_logprob = seq.cum_logprob + append.entry[token].logprob
        finish = stop.check(seq, self.params, token)
        return [append] if finish is None else [append, finish]
