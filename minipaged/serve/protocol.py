"""The OpenAI wire format: requests checked field by field, responses and errors built.

A request body is parsed with :func:`parse` into a pydantic model (:class:`CompletionRequest`,
:class:`ChatCompletionRequest`). The models are strict, as a teaching server should be: ``"16"``
is not an int, ``true`` is not a count, ``NaN`` is not a temperature, and an unknown field (a
typo such as ``max_token``) is refused instead of silently ignored. OpenAI fields that minipaged
does not implement (penalties, ``logit_bias``, ``echo``, ``suffix``, ``best_of``, ``top_logprobs``
on completions, and vLLM's ``repetition_penalty``, ``min_p``, ``min_tokens``) are accepted only
at their neutral value, so a client that always sends them (vLLM's serving benchmark does) still
works. Log-probabilities are implemented (:mod:`minipaged.serve.logprobs`): ``logprobs: k`` on
completions, ``logprobs: true`` with ``top_logprobs: k`` on chat completions, ``k`` in
``0 .. MAX_LOGPROBS`` (20, vLLM's ``max_logprobs``).

Every refusal is an :class:`APIError`, answered as OpenAI answers errors::

    {"error": {"message": "max_tokens: ...", "type": "invalid_request_error", "param": "max_tokens", "code": 400}}

The message starts with the field it is about.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, FiniteFloat, StrictBool, StrictInt, StrictStr, ValidationError

from minipaged.engine.outputs import RequestOutput
from minipaged.engine.sampling_params import MAX_LOGPROBS
from minipaged.serve.logprobs import choice_logprobs

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """A refusal with an HTTP status, a message for people and the field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}

    def body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: StrictBool = False


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_zero(x: object) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0)


# OpenAI fields minipaged does not implement, and what counts as "not used" for each.
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "presence_penalty": _is_zero,
    "frequency_penalty": _is_zero,
    "logit_bias": lambda v: v is None or v == {},
    "echo": lambda v: v is None or v is False,
    "suffix": lambda v: v is None,
    "best_of": lambda v: v is None or (_is_int(v) and v == 1),
    # vLLM's own extensions (its serving benchmark sends repetition_penalty=1.0)
    "repetition_penalty": lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1),
    "min_p": _is_zero,
    "min_tokens": _is_zero,
}


class SamplingRequest(_Strict):
    """The fields completions and chat completions share (vLLM's extensions included)."""

    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: FiniteFloat | None = None
    top_p: FiniteFloat | None = None
    top_k: StrictInt | None = None
    seed: StrictInt | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    user: StrictStr | None = None  # shown as the request's owner on the projector
    # accepted only at their neutral value (see NEUTRAL)
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None
    best_of: Any = None
    repetition_penalty: Any = None
    min_p: Any = None
    min_tokens: Any = None

    unsupported: ClassVar[dict[str, Callable[[Any], bool]]] = NEUTRAL

    def check_unsupported(self) -> None:
        for name, unused in self.unsupported.items():
            if not unused(getattr(self, name, None)):
                raise APIError(400, f"{name}: not supported by minipaged (leave it out)", name)

    def num_logprobs(self) -> int | None:
        """``SamplingParams.logprobs``: the alternatives listed per token (None: no logprobs)."""
        return None

    @staticmethod
    def _count(name: str, k: int) -> int:
        if not 0 <= k <= MAX_LOGPROBS:
            raise APIError(
                400, f"{name}: must be in [0, {MAX_LOGPROBS}] (vLLM's max_logprobs: {MAX_LOGPROBS}), got {k}", name
            )
        return k

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingRequest):
    prompt: Any = None  # a string, token ids, or a list of either: checked by prompts()
    logprobs: StrictInt | None = None  # the alternatives listed per token (0: the token alone)
    echo: Any = None
    suffix: Any = None
    top_logprobs: Any = None  # chat's field: here accepted only at its neutral value
    unsupported = {**NEUTRAL, "top_logprobs": _is_zero}

    def num_logprobs(self) -> int | None:
        return None if self.logprobs is None else self._count("logprobs", self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request, one list entry per prompt; APIError for anything else."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p, list) and p:
            if all(_is_int(t) for t in p):
                return [p]
            if all(isinstance(x, str) for x in p):
                return list(p)
            if all(isinstance(x, list) and x and all(_is_int(t) for t in x) for x in p):
                return list(p)
        raise APIError(
            400, "prompt: must be a string, a non-empty list of token ids (ints), or a list of either", "prompt"
        )


class ContentPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: StrictStr | list[ContentPart]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: StrictInt | None = None  # OpenAI's newer name for max_tokens
    logprobs: StrictBool | None = None  # whether each token's logprob is returned
    top_logprobs: StrictInt | None = None  # with logprobs: true, the alternatives listed per token

    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:  # as OpenAI and vLLM refuse it
                raise APIError(400, "top_logprobs: needs logprobs: true", "top_logprobs")
            return None
        return self._count("top_logprobs", self.top_logprobs or 0)

    @property
    def output_cap(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


Req = TypeVar("Req", bound=SamplingRequest)


def parse(model: type[Req], body: bytes) -> Req:
    """Bytes of a request body -> a checked request model, or APIError(400) naming the field."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and bad UTF-8 are ValueErrors
        raise APIError(400, f"body: not valid JSON ({str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise APIError(400, f"body: must be a JSON object, got {type(data).__name__}")
    try:
        request = model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None
    request.check_unsupported()
    request.num_logprobs()  # its counts checked with the other fields, before the prompt is read
    return request


def validation_error(e: ValidationError) -> APIError:
    """pydantic's first complaint, as a message that starts with the field's name."""
    err = e.errors(include_url=False)[0]
    # the location, without the tags pydantic adds for the members of a union ("str", "list[str]")
    field = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and (p in UNION_TAGS or "[" in p)))
    field = field or "body"
    if err["type"] == "extra_forbidden":
        return APIError(400, f"{field}: unknown field (see docs/serving.md for the fields minipaged accepts)", field)
    if err["type"] == "missing":
        return APIError(400, f"{field}: required", field)
    return APIError(400, f"{field}: {err['msg']} (got {_short(err.get('input'))})", field.split(".")[0])


def _short(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


# -- responses --------------------------------------------------------------------------------
def choice_index(prompt_index: int, sample_index: int, n: int) -> int:
    """Choices are numbered prompt by prompt, ``n`` per prompt (as vLLM numbers them)."""
    return prompt_index * n + sample_index


def usage(outputs: list[RequestOutput]) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_response(response_id: str, model: str, outputs: list[RequestOutput], n: int) -> dict:
    choices = [
        {
            "index": choice_index(i, c.index, n),
            "text": c.text,
            "logprobs": choice_logprobs(c, chat=False, k=0),
            "finish_reason": c.finish_reason,
        }
        for i, o in enumerate(outputs)
        for c in o.outputs
    ]
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(outputs),
    }


def chat_response(response_id: str, model: str, output: RequestOutput, top_logprobs: int) -> dict:
    """``top_logprobs``: the alternatives each token lists, when the request asked for logprobs."""
    choices = [
        {
            "index": c.index,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": choice_logprobs(c, chat=True, k=top_logprobs),
            "finish_reason": c.finish_reason,
        }
        for c in output.outputs
    ]
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage([output]),
    }


def stream_chunk(
    response_id: str,
    model: str,
    chat: bool,
    index: int,
    text: str | None,
    finish: str | None,
    logprobs: dict | None = None,
) -> dict:
    """One streamed piece of one choice. ``text=None`` on a chat stream's first chunk: the role.
    ``logprobs``: those of the tokens new in this chunk, in the API's shape, if asked for."""
    if chat:
        delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": response_id, "object": kind, "created": int(time.time()), "model": model, "choices": [choice]}


def usage_chunk(response_id: str, model: str, chat: bool, outputs: list[RequestOutput]) -> dict:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {
        "id": response_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(outputs),
    }


def sse(data: dict | str) -> str:
    """One server-sent event carrying JSON (or the literal ``[DONE]``)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
