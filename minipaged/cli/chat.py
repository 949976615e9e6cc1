"""``python -m minipaged chat``: a multi-turn chat in the terminal, streamed through the step API.

Each turn renders the whole conversation so far with the model's chat template and adds it as
one request (``add_request``), then steps the engine (``step``) and prints the new part of the
answer after every step. Turn k+1's prompt starts with turn k's prompt and answer, whose full
blocks are still in the pool after turn k finished (freed, but cached): with prefix caching, only
the new message and the last partial block are computed. The figure after each answer says how
many prompt tokens the cache served::

    you> What is a page table?
    model> A page table maps virtual addresses to physical ones ...
    [58 prompt tokens, 0 from the prefix cache]
    you> And why is it needed?
    model> ...
    [112 prompt tokens, 96 from the prefix cache]

Ctrl-C during an answer aborts its request (``abort_request`` frees its blocks; a step cut
short leaves no trace) and keeps what was shown of the answer in the conversation. With piped
stdin every line is a message and the chat ends at the end of the input.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from minipaged.engine.llm import LLM
from minipaged.engine.messages import render, template_of
from minipaged.engine.outputs import RequestOutput
from minipaged.engine.sampling_params import SamplingParams
from minipaged.serve.deltas import TextStream

USER, MODEL = "you> ", "model> "
EXIT = "/exit"


class ChatSession:
    """One conversation with ``llm`` (prefix caching on, so turn k+1 reuses turn k's blocks)."""

    def __init__(self, llm: LLM, params: SamplingParams, system: str | None = None) -> None:
        self.llm, self.params = llm, params
        self.template = template_of(llm.tokenizer)  # refuses a model that cannot chat, before any turn
        self.history: list[dict[str, str]] = [{"role": "system", "content": system}] if system is not None else []

    def prompt_ids(self, message: str) -> list[int]:
        """The token ids of the conversation with ``message`` added; the oldest exchanges are dropped
        (the system prompt kept) while it and the answer would not fit in ``max_model_len``."""
        while True:
            turn = [*self.history, {"role": "user", "content": message}]
            [(_, ids)] = render([turn], self.template, self.llm.tokenizer, add_generation_prompt=True)
            first = 1 if self.history and self.history[0]["role"] == "system" else 0
            if len(ids) + self.params.max_tokens <= self.llm.max_model_len or len(self.history) < first + 2:
                return ids
            del self.history[first : first + 2]

    def ask(self, message: str, out: TextIO) -> tuple[RequestOutput | None, bool]:
        """Stream the answer to ``message`` into ``out``; -> (its last output, whether Ctrl-C stopped it).

        The message and what was shown of the answer join the conversation (nothing, if no word of
        an answer was shown).
        """
        request_id = self.llm.add_request(self.prompt_ids(message), self.params)
        stream, last, stopped = TextStream(), None, False
        try:
            while self.llm.has_unfinished_requests():
                for o in self.llm.step():
                    if o.request_id == request_id:
                        last = o
                        out.write(stream.delta(o.outputs[0].text, o.finished))
                        out.flush()
        except KeyboardInterrupt:
            self.llm.abort_request(request_id)
            stopped = True
        answer = last.outputs[0].text[: stream.sent] if last is not None else ""
        if answer:
            self.history += [{"role": "user", "content": message}, {"role": "assistant", "content": answer}]
        return last, stopped


def figure(last: RequestOutput | None, stopped: bool) -> str:
    """The line after an answer: ``[312 prompt tokens, 288 from the prefix cache]``."""
    head = "stopped; " if stopped else ""
    if last is None:
        return f"[{head}no token yet]"
    return f"[{head}{len(last.prompt_token_ids)} prompt tokens, {last.num_cached_tokens} from the prefix cache]"


def read_message(tty: bool) -> str | None:
    """The next message, or None at the end of the input; a piped line is echoed after the marker."""
    if tty:
        try:
            return input(USER)
        except EOFError:
            print()
            return None
    line = "\n"
    while not line.strip():  # blank piped lines are skipped unseen
        line = sys.stdin.readline()
        if not line:
            return None
    print(f"{USER}{line.rstrip()}", flush=True)
    return line


def main(args: argparse.Namespace) -> None:
    tty = sys.stdin.isatty()
    if tty:
        import readline  # noqa: F401  (line editing and history for input())
    try:
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
        session = ChatSession(LLM(args.model, enable_prefix_caching=True), params, args.system)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    dim, plain = ("\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "")
    if tty:
        print(f"Chatting with {args.model}. Ctrl-C stops an answer; Ctrl-D or {EXIT} leaves.")
    while True:
        try:
            message = read_message(tty)
        except KeyboardInterrupt:
            print(f"\n(Ctrl-D or {EXIT} leaves)")
            continue
        if message is None or message.strip() == EXIT:
            return
        if not message.strip():
            continue
        print(MODEL, end="", flush=True)
        try:
            last, stopped = session.ask(message.strip(), sys.stdout)
        except ValueError as e:  # a message too long for the model even alone
            print(f"\nerror: {e}")
            continue
        print(f"\n{dim}{figure(last, stopped)}{plain}", flush=True)
