"""API requests -> engine inputs, checked against the engine's limits and the server's caps.

Everything that the engine would refuse is refused here first, with a message that starts with
the field at fault, so nothing invalid is ever queued: a token id outside the vocabulary, a
prompt over ``max_model_len`` or the server's prompt cap, ``max_tokens`` under 1 or over the cap,
``n`` over ``max_num_seqs``, a request that could not fit the whole KV pool.

The lesson's prompt (``--preamble FILE``) is what every student's request starts with, so that
they all start with the same blocks, stored once (stage 6's prefix cache). For a chat model it is
the system message of every chat that brings none (:data:`LESSON_SYSTEM_PROMPT` by default:
about 100 tokens of SmolLM2's template, 6 full blocks of 16); for a model that cannot chat, every
text prompt becomes the preamble, then the student's text (for the embedded copy model, in its
format ``preamble<copy>text<end>``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from minipaged.engine import inputs as engine_inputs
from minipaged.engine.llm import LLM
from minipaged.engine.sampling_params import SamplingParams
from minipaged.model.chat_template import ChatTemplate
from minipaged.serve.limits import Limits
from minipaged.serve.protocol import APIError, SamplingRequest
from minipaged.tiny import task

SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams) if f.init}
# the fields an engine error message may start with, e.g. "top_p must be in (0, 1]"
PARAM_NAMES = SAMPLING_FIELDS | {"prompt"}
LESSON_SYSTEM_PROMPT = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Today you are helping a class that "
    "learns how a language model is served: how a prompt becomes tokens, how the keys and values of every token "
    "are kept in fixed-size blocks of a paged cache, and how one engine step runs the requests of many students "
    "together. Answer each question in two or three short sentences, in plain English, and say so when you are "
    "not sure."
)


class EngineInputs:
    """What the server knows of the engine (read once, never changed) and how it checks requests."""

    def __init__(
        self, llm: LLM, limits: Limits, preamble: str | None = None, chat_template: ChatTemplate | None = None
    ) -> None:
        self.tokenizer = llm.tokenizer
        self.chat_template = chat_template
        self.vocab_size = llm.model.config.vocab_size
        self.max_model_len = llm.max_model_len
        self.max_num_seqs = llm.config.max_num_seqs
        self.limits = limits
        self.engine_limits = llm.limits  # what the engine itself refuses, checked the engine's way
        self.max_prompt_tokens = min(limits.max_prompt_tokens or self.max_model_len - 1, self.max_model_len - 1)
        self.preamble = preamble
        specials = getattr(self.tokenizer, "special_ids", {})
        self.copy_model = task.COPY in specials and task.END in specials

    def lesson_prompt(self, text: str) -> str:
        """A student's text prompt inside the lesson's prompt (unchanged without a preamble, or for a
        chat model, whose preamble is its chats' system message)."""
        if self.preamble is None or self.chat_template is not None:
            return text
        return task.prompt_for(text, self.preamble) if self.copy_model else self.preamble + text

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The token ids of a chat (``[{"role": ..., "content": ...}, ...]``) laid out by the model's
        template, the lesson's system message first if the chat brings none."""
        if self.chat_template is None:
            raise APIError(
                400,
                "messages: this model has no chat template (no chat_template in its tokenizer_config.json), "
                "so it cannot chat: use /v1/completions with a prompt",
                "messages",
            )
        if not messages:
            raise APIError(400, "messages: at least one message is needed", "messages")
        if self.preamble is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.preamble}, *messages]
        try:
            text = self.chat_template.render(messages)
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
        assert self.tokenizer is not None  # the chat template came from the tokenizer's files
        ids = self.tokenizer.encode(text, add_special_tokens=False)  # the template wrote the special tokens
        self.check_ids(ids, "messages")
        return ids

    def shared_prefix_tokens(self) -> int:
        """How many leading tokens every student's request shares (the lesson's prompt, as the model
        sees it); 0 without a preamble. Two students' prompts that differ only in their text tell.
        Raises :class:`APIError` if the lesson's prompt alone is over the prompt limits."""
        if self.preamble is None or self.tokenizer is None:
            return 0
        if self.chat_template is not None:
            a, b = ([{"role": "user", "content": t}] for t in ("a", "b"))
            ids = self.chat_prompt(a), self.chat_prompt(b)
        else:
            ids = self.prompt("a", 0, False)[1], self.prompt("b", 0, False)[1]
        return next(i for i, (x, y) in enumerate(zip(*ids)) if x != y)

    def prompt(self, prompt: str | list[int], index: int, many: bool) -> tuple[str | list[int], list[int]]:
        """(what to give ``add_request``, its token ids). ``many``: the request has several prompts."""
        where = f"prompt[{index}]" if many else "prompt"
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise APIError(400, f"{where}: this model has no tokenizer: send token ids", "prompt")
            prompt = self.lesson_prompt(prompt)
            ids = self.tokenizer.encode(prompt)
        else:
            ids = prompt
        self.check_ids(ids, where)
        return prompt, ids

    def check_ids(self, ids: list[int], where: str = "prompt") -> None:
        if not ids:
            raise APIError(400, f"{where}: empty", "prompt")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"{where}: token id {bad} is outside the vocabulary [0, {self.vocab_size})", "prompt")
        if len(ids) > self.max_prompt_tokens:
            raise APIError(
                400,
                f"{where}: {len(ids)} tokens, over the server's limit of {self.max_prompt_tokens} "
                f"(max_model_len {self.max_model_len}, --max-prompt-tokens)",
                "prompt",
            )

    def sampling_params(self, req: SamplingRequest, prompts: list[list[int]], max_tokens: int | None) -> SamplingParams:
        """The request's SamplingParams; ``max_tokens`` None: as many as fit (capped)."""
        longest = max(len(p) for p in prompts)
        if max_tokens is None:
            max_tokens = max(min(self.limits.max_tokens, self.max_model_len - longest), 1)
        if max_tokens < 1:
            raise APIError(400, f"max_tokens: must be >= 1, got {max_tokens}", "max_tokens")
        if max_tokens > self.limits.max_tokens:
            raise APIError(
                400,
                f"max_tokens: {max_tokens} is over the server's cap of {self.limits.max_tokens} (--max-tokens-cap)",
                "max_tokens",
            )
        if longest + max_tokens > self.max_model_len:
            raise APIError(
                400,
                f"max_tokens: {longest} prompt tokens + max_tokens {max_tokens} = {longest + max_tokens} "
                f"exceeds max_model_len {self.max_model_len}",
                "max_tokens",
            )
        if not 1 <= req.n <= self.max_num_seqs:
            raise APIError(400, f"n: must be in [1, max_num_seqs={self.max_num_seqs}], got {req.n}", "n")
        extra = self._stop_fields(req)
        values: dict[str, Any] = dict(
            temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed, logprobs=req.num_logprobs()
        )
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                n=req.n,
                ignore_eos=req.ignore_eos,
                **{k: v for k, v in values.items() if v is not None},
                **extra,
            )
        except (ValueError, TypeError) as e:
            name = str(e).split()[0]
            raise APIError(400, f"{name}: {e}", name if name in PARAM_NAMES else None) from None
        for i, ids in enumerate(prompts):  # the engine's own check, last: e.g. more blocks than the pool has
            try:
                engine_inputs.check_request(ids, params, i, self.engine_limits)
            except (ValueError, TypeError) as e:
                raise APIError(400, f"prompt: {e}", "prompt") from None
        return params

    def _stop_fields(self, req: SamplingRequest) -> dict:
        """``stop`` / ``stop_token_ids`` for SamplingParams, checked with the field's name."""
        extra: dict = {}
        stops = req.stop_strings
        if any(s == "" for s in stops):
            raise APIError(400, "stop: an empty stop string would stop at once", "stop")
        for t in req.stop_token_ids or []:
            if not 0 <= t < self.vocab_size:
                raise APIError(
                    400, f"stop_token_ids: {t} is outside the vocabulary [0, {self.vocab_size})", "stop_token_ids"
                )
        for name, value in (("stop", stops), ("stop_token_ids", list(req.stop_token_ids or []))):
            if value:
                extra[name] = value
        return extra
