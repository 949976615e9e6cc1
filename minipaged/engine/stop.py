"""When a sampled sequence stops, and why (vLLM's rules).

Checked after each token is appended, in this order: an end-of-sequence token of the model
(unless ``ignore_eos``) or one of the request's ``stop_token_ids`` ends it with ``"stop"``;
so does one of its ``stop`` strings appearing in the output text, which is then cut before
the string; otherwise ``max_tokens`` generated tokens, or a sequence of ``max_model_len``
tokens, end it with ``"length"``. A stop token's id, or the stop string, is kept as the
sequence's ``stop_reason``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.sequence import Sequence


class StopChecker:
    def __init__(self, eos_token_ids: Iterable[int], max_model_len: int, tokenizer: Any = None) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer  # decodes the output text for stop strings

    def check(self, seq: Sequence, params: SamplingParams) -> str | None:
        """The finish reason once ``seq``'s last token is appended (``params``: its request's), or None to go on."""
        token, stop_ids = seq.token_ids[-1], params.stop_token_ids or ()
        if (not params.ignore_eos and token in self.eos_token_ids) or token in stop_ids:
            seq.stop_reason = token if token in stop_ids else None  # vLLM: None for the model's own EOS
            return "stop"
        if params.stop and self._stop_string(seq, tuple(params.stop)):
            return "stop"
        if seq.num_output_tokens >= params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def _stop_string(self, seq: Sequence, stops: tuple[str, ...]) -> bool:
        """Whether the output text now holds a stop string; if so the text is cut before it."""
        text = self.tokenizer.decode(seq.output_token_ids)
        found = [(text.find(s), s) for s in stops if s in text]
        if not found:
            return False
        seq.text_len, seq.stop_reason = min(found)
        return True
