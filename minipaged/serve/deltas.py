"""Streaming text: how much of a choice's text may be sent now.

The engine hands back each sample's whole text so far after every step. A stream sends the new
part, but not all of it yet:

- a character split across tokens (a byte tokenizer emits UTF-8 one byte at a time) decodes as
  U+FFFD until its last byte arrives: trailing U+FFFD waits for the next step;
- with ``stop`` strings, a tail that could be the start of a stop string waits too: if the stop
  string completes, the engine cuts it from the text, and it must never have been sent.

Once the choice is finished everything left is sent, so the streamed pieces always add up to
the text a non-streaming request (and ``LLM.generate``) returns.
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"


def sendable(text: str, stop: Sequence[str] = (), finished: bool = False) -> int:
    """How many leading characters of ``text`` are safe to send."""
    if finished:
        return len(text)
    end = len(text.rstrip(REPLACEMENT))
    held = 0
    for s in stop:
        # the longest proper prefix of s that the text ends with
        for k in range(min(len(s) - 1, end), held, -1):
            if text.endswith(s[:k], 0, end):
                held = k
                break
    return end - held


class TextStream:
    """The text of one choice as a stream sees it: what was sent, what to send next."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = tuple(stop)
        self.sent = 0  # characters sent so far

    def delta(self, text: str, finished: bool) -> str:
        """The piece to send now (maybe empty), given the choice's whole text so far."""
        end = sendable(text, self.stop, finished)
        piece = text[self.sent : end]
        self.sent = max(self.sent, end)
        return piece
