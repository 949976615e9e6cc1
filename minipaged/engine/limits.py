"""What a request is checked against: one engine's settings, gathered once (:class:`Limits`).

The request groups' own checks (:meth:`SampleGroup.check
<minipaged.engine.request_group.SampleGroup.check>`, :meth:`BeamGroup.check
<minipaged.engine.beam_search.BeamGroup.check>`) and :func:`~minipaged.engine.inputs.check_request`
read it; it sits below both so that neither imports the other to name it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What a request is checked against (one engine's settings)."""

    vocab_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    has_tokenizer: bool
    can_fork: bool
    kv_room: Callable[[int, int], str | None]  # (tokens, sequences) -> why they never fit, or None
