"""The second of a step's three records: what the model runner hands back (vLLM V1's
``ModelRunnerOutput``).

One token per sampling row, or for a beam, its most likely tokens with their log-probabilities;
the log-probabilities a request asked for (:mod:`minipaged.engine.logprobs`); and where the
runner's time went (``seconds``: prepare, forward, attention inside the forward, sample), read
by whoever times steps (:class:`~minipaged.bench.step_timer.StepTimer`) without patching the
engine. Nothing here points back into the engine: it is plain data, printable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.engine.logprobs import TokenLogprobs


@dataclass
class ModelRunnerOutput:
    """``token_ids[i]``: the token drawn for ``samples[i]`` of the step's
    :class:`~minipaged.engine.scheduler_output.SchedulerOutput` (-1 for a beam's row);
    ``candidates[i]``: for a beam, its ``2 x beam_width`` most likely tokens as ``(token, logprob)``,
    most likely first. ``logprobs[i]``: the entry of the token drawn for ``samples[i]``, if its
    request asked; ``prompt_logprobs[row]``: the entries of the prompt tokens that row scored, in
    order. ``seconds``: the runner's phases (``prepare``, ``forward``, ``attention``, ``sample``)."""

    token_ids: list[int] = field(default_factory=list)
    candidates: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
