"""What the engine keeps of a request and hands back: :class:`RequestOutput` s, as in vLLM.

A :class:`RequestOutput` holds the prompt and one :class:`CompletionOutput` per sample (its
text and token ids so far, and why it stopped). :meth:`LLM.step` returns one per request that
got a token; ``generate`` returns one per prompt. (What a step did to the pool, for drawing, is
:mod:`minipaged.viz.snapshot`'s.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minipaged.engine.beam_search import BeamGroup
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
class Request:
    """What the engine keeps of one request: the prompt and its sequences (``seqs`` is the
    family list the samples share), or its beam search."""

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    beam: BeamGroup | None = None

    def live(self) -> list[Sequence]:
        """The sequences that may still run (to abort them)."""
        return list(self.beam.live) if self.beam is not None else self.seqs

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
            outs.append(CompletionOutput(s.sample_index, text, s.output_token_ids, s.finish_reason, s.stop_reason))
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs, self.seqs[0].num_cached_tokens)
