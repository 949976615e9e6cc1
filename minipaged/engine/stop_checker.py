"""When a sample stops (vLLM's rules), decided before its token is appended.

A sample group asks after each token, in this order: an end-of-sequence token of the model
(unless ``ignore_eos``) or one of the request's ``stop_token_ids`` ends it with ``"stop"``; so
does one of its ``stop`` strings appearing in the output text, which is then cut before the
string; otherwise ``max_tokens`` generated tokens, or a sequence of ``max_model_len`` tokens,
end it with ``"length"``. A stop token's id, or the stop string, is kept as the sequence's
``stop_reason``. The answer is a :class:`~minipaged.engine.decisions.Finish` (or None): the
scheduler applies it, the checker changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minipaged.engine.decisions import Finish
from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.sequence import Sequence


class StopChecker:
    """The stop rules above; ``tokenizer`` decodes the output text for stop strings."""

    def __init__(self, eos_token_ids: Iterable[int], max_model_len: int, tokenizer: Any = None) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer  # decodes the output text for stop strings

    def check(self, seq: Sequence, params: SamplingParams, token: int) -> Finish | None:
        """The finish of ``seq`` once ``token`` is appended to it (``params``: its request's), or None to go on."""
        stop_ids = params.stop_token_ids or ()
        if (not params.ignore_eos and token in self.eos_token_ids) or token in stop_ids:
            # vLLM: the stop reason is None for the model's own EOS
            return Finish(seq, "stop", stop_reason=token if token in stop_ids else None)
        if params.stop:
            found = self._stop_string(seq.output_token_ids + [token], tuple(params.stop))
            if found is not None:
                return Finish(seq, "stop", stop_reason=found[1], text_len=found[0])
        if seq.num_output_tokens + 1 >= params.max_tokens or len(seq) + 1 >= self.max_model_len:
            return Finish(seq, "length")
        return None

    def _stop_string(self, output: list[int], stops: tuple[str, ...]) -> tuple[int, str] | None:
        """(where the text is cut, the stop string) if the output text holds a stop string."""
        text = self.tokenizer.decode(output)
        found = [(text.find(s), s) for s in stops if s in text]
        return min(found) if found else None
