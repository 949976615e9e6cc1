"""What a request group decides after a step, as data: :class:`Append`, :class:`Fork`, :class:`Finish`.

A group (:mod:`~minipaged.engine.request_group`, :mod:`~minipaged.engine.beam_search`) reads the
step's :class:`~minipaged.engine.runner_output.ModelRunnerOutput` and says what should happen to
its sequences; it changes nothing the engine owns. The scheduler applies the decisions in the
order they come (:meth:`Scheduler.apply <minipaged.engine.scheduler.Scheduler.apply>`), the one
place that touches the queues and the KV memory after a step:

- ``Append(seq, token, entry, cum_logprob)``: ``token`` joins ``seq`` (with its logprob entry
  if the request asked for one, and the sequence's new ``cum_logprob`` where it keeps one);
- ``Fork(parent, child, beside)``: ``child`` shares every block of ``parent`` and runs, placed
  right after its parent (``beside``, the beams of one search stay together) or last;
- ``Finish(seq, reason, stop_reason, text_len)``: ``seq`` is done (``"stop"``, ``"length"``,
  ``"pruned"``); its blocks are freed at once.

Print a list of them to see what a step did to a request.
"""

from __future__ import annotations

from dataclasses import dataclass

from minipaged.engine.logprobs import TokenLogprobs
from minipaged.engine.sequence import Sequence


@dataclass
class Append:
    """``token`` joins ``seq``; ``entry``: its logprob entry (asked for), ``cum_logprob``: the new sum."""

    seq: Sequence
    token: int
    entry: TokenLogprobs | None = None
    cum_logprob: float | None = None


@dataclass
class Fork:
    """``child`` shares ``parent``'s blocks and runs, right after ``parent`` if ``beside`` (else last)."""

    parent: Sequence
    child: Sequence
    beside: bool = False


@dataclass
class Finish:
    """``seq`` is done, for ``reason``; ``stop_reason`` (the stop token or string) and ``text_len``
    (the output text cut before a stop string) when a stop rule ended it."""

    seq: Sequence
    reason: str
    stop_reason: int | str | None = None
    text_len: int | None = None


Decision = Append | Fork | Finish
