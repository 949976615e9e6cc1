"""What the engine hands back: :class:`RequestOutput` s, as in vLLM (what it keeps of a request
is its request group, :mod:`minipaged.engine.request_group`).

A :class:`RequestOutput` holds the prompt and one :class:`CompletionOutput` per sample (its text
and token ids so far, and why it stopped). With ``SamplingParams(logprobs=k)`` a sample also has
``logprobs``, one entry per token of ``token_ids``, and ``cumulative_logprob``, their sum; with
``prompt_logprobs=k`` the request has ``prompt_logprobs``, one entry per prompt token (``None``
for the first). An entry is ``{token_id: Logprob}`` (:mod:`minipaged.engine.logprobs`); without
the params these are ``None``, as in vLLM. :meth:`LLM.step` returns one per request that got a
token; ``generate`` returns one per prompt. (What a step did to the pool, for drawing, is
:mod:`minipaged.viz.snapshot`'s.)
"""

from __future__ import annotations

from dataclasses import dataclass

from minipaged.engine.logprobs import TokenLogprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    cumulative_logprob: float | None = None
    logprobs: list[TokenLogprobs] | None = None


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    prompt_logprobs: list[TokenLogprobs | None] | None = None

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)
