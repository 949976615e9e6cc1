"""Log-probabilities on the wire: the engine's entries (:mod:`minipaged.engine.logprobs`) in the two
shapes OpenAI gives them.

A sample's ``CompletionOutput.logprobs`` holds one entry per generated token, ``{token_id:
Logprob}``: the token first, then the ``k`` most likely tokens. ``/v1/completions`` (``logprobs:
k``) answers with four parallel lists, as OpenAI's legacy completions do::

    {"tokens": ["h", "i"], "token_logprobs": [-0.01, -0.2],
     "top_logprobs": [{"h": -0.01, "x": -4.9}, {"i": -0.2, "a": -1.8}], "text_offset": [0, 1]}

``top_logprobs[i]`` maps each listed token's text to its logprob (the token itself and the top
``k``: ``k`` or ``k + 1`` keys, as in vLLM), and ``text_offset[i]`` is where token ``i``'s text
starts, counting each token's text as decoded on its own. ``/v1/chat/completions``
(``logprobs: true, top_logprobs: k``) answers with one object per token::

    {"content": [{"token": "h", "logprob": -0.01, "bytes": [104],
                  "top_logprobs": [{"token": "h", "logprob": -0.01, "bytes": [104]}, ...]}]}

where ``top_logprobs`` lists exactly the ``k`` most likely tokens, most likely first, and
``bytes`` is the token text's UTF-8. A token is its text decoded alone, or ``token_id:<id>`` for
a model without a tokenizer (vLLM's spelling). JSON has no -inf: a logprob is clamped at -9999
(vLLM's floor).

A stream sends each token's logprobs once, in the first chunk sent after the token arrived
(:class:`LogprobsStream`), so the chunks' lists add up to the non-streamed answer's.
"""

from __future__ import annotations

from minipaged.engine.logprobs import Logprob, TokenLogprobs
from minipaged.engine.outputs import CompletionOutput

FLOOR = -9999.0


def token_text(token: int, lp: Logprob) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"token_id:{token}"


def _value(lp: Logprob) -> float:
    return max(lp.logprob, FLOOR)


def _chat_token(token: int, lp: Logprob) -> dict:
    text = token_text(token, lp)
    return {"token": text, "logprob": _value(lp), "bytes": list(text.encode("utf-8", errors="replace"))}


def completion_logprobs(tokens: list[int], entries: list[TokenLogprobs], offset: int) -> dict:
    """The completions shape for ``tokens`` and their ``entries``, the first token's text at ``offset``."""
    texts = [token_text(t, e[t]) for t, e in zip(tokens, entries)]
    offsets = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": texts,
        "token_logprobs": [_value(e[t]) for t, e in zip(tokens, entries)],
        "top_logprobs": [{token_text(t, lp): _value(lp) for t, lp in e.items()} for e in entries],
        "text_offset": offsets,
    }


def chat_logprobs(tokens: list[int], entries: list[TokenLogprobs], k: int) -> dict:
    """The chat shape for ``tokens`` and their ``entries``, ``k`` alternatives each."""
    content = []
    for t, e in zip(tokens, entries):
        best = sorted(e.items(), key=lambda item: item[1].rank or 0)[:k]  # stable: ties keep the engine's order
        content.append({**_chat_token(t, e[t]), "top_logprobs": [_chat_token(u, lp) for u, lp in best]})
    return {"content": content}


def choice_logprobs(c: CompletionOutput, chat: bool, k: int) -> dict | None:
    """A whole choice's logprobs in its API's shape; None when its request asked for none."""
    if c.logprobs is None:
        return None
    return chat_logprobs(c.token_ids, c.logprobs, k) if chat else completion_logprobs(c.token_ids, c.logprobs, 0)


class LogprobsStream:
    """One streamed choice's logprobs: which tokens were sent, and where the next one's text starts."""

    def __init__(self, chat: bool, k: int) -> None:
        self.chat, self.k = chat, k
        self.sent = 0  # tokens whose logprobs were sent
        self.offset = 0  # completions: text_offset of the next token

    def delta(self, c: CompletionOutput) -> dict | None:
        """The logprobs of the tokens ``c`` got since the last call (None if it asked for none)."""
        if c.logprobs is None:
            return None
        tokens, entries = c.token_ids[self.sent :], c.logprobs[self.sent :]
        self.sent = len(c.token_ids)
        if self.chat:
            return chat_logprobs(tokens, entries, self.k)
        shaped = completion_logprobs(tokens, entries, self.offset)
        self.offset += sum(len(t) for t in shaped["tokens"])
        return shaped
