"""``POST /v1/completions`` and ``POST /v1/chat/completions``: from an HTTP request to the engine and back.

A handler checks the request (:mod:`minipaged.serve.protocol`, :mod:`minipaged.serve.inputs`),
asks admission control for room (:mod:`minipaged.serve.limits`), submits one engine request
per prompt to the engine loop, then either waits for the final outputs or streams them as
server-sent events, one chunk per choice per engine step (coalesced if the client reads slower
than the engine steps). Whatever way the request ends (finished, failed, or the client gone),
the unfinished engine requests are aborted and the admission ticket returned.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from minipaged.engine.outputs import RequestOutput
from minipaged.engine.sampling_params import SamplingParams
from minipaged.serve import protocol
from minipaged.serve.deltas import TextStream
from minipaged.serve.engine_loop import Submission
from minipaged.serve.logprobs import LogprobsStream
from minipaged.serve.protocol import APIError, ChatCompletionRequest, CompletionRequest, SamplingRequest

router = APIRouter()
LABEL_CHARS = 16


class EngineStream(StreamingResponse):
    """A server-sent-event stream that calls ``on_close`` however it ends, even if it never started."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def clean_label(user: str | None) -> str:
    """The ``user`` field as a short label for the projector (printable characters only)."""
    return "".join(c for c in (user or "") if c.isprintable()).strip()[:LABEL_CHARS]


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    server = request.app.state.server
    req = protocol.parse(CompletionRequest, await request.body())
    server.check_model(req.model)
    prompts = req.prompts()
    encoded = [server.inputs.prompt(p, i, len(prompts) > 1) for i, p in enumerate(prompts)]
    max_tokens = 16 if req.max_tokens is None else req.max_tokens  # OpenAI's default for completions
    params = server.inputs.sampling_params(req, [ids for _, ids in encoded], max_tokens)
    return await _run(request, req, encoded, params, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    server = request.app.state.server
    req = protocol.parse(ChatCompletionRequest, await request.body())
    server.check_model(req.model)
    ids = server.inputs.chat_prompt([{"role": m.role, "content": m.text()} for m in req.messages])
    params = server.inputs.sampling_params(req, [ids], req.output_cap)
    return await _run(request, req, [(ids, ids)], params, chat=True)


async def _run(
    request: Request,
    req: SamplingRequest,
    encoded: list[tuple[str | list[int], list[int]]],
    params: SamplingParams,
    chat: bool,
) -> Response:
    server = request.app.state.server
    client = request.client.host if request.client else "unknown"
    ticket = server.admission.admit(client, len(encoded), server.loop.num_running_requests)
    events: asyncio.Queue = asyncio.Queue()
    label = clean_label(req.user)
    subs = [
        Submission(prompt, params, events, label=label, prompt_index=i, num_prompt_tokens=len(ids))
        for i, (prompt, ids) in enumerate(encoded)
    ]
    for sub in subs:
        server.loop.submit(sub)

    def close() -> None:
        for sub in subs:
            server.loop.abort(sub)
        ticket.release()

    response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        chunks = _stream(events, subs, req, response_id, server.model_name, chat, include_usage)
        return EngineStream(chunks, on_close=close)
    try:
        outputs = await _until_done_or_gone(request, _collect(events, len(subs)))
    finally:
        close()
    if outputs is None:  # the client left: nobody to answer
        return Response(status_code=499)
    if chat:
        return JSONResponse(protocol.chat_response(response_id, server.model_name, outputs[0], _top_logprobs(req)))
    return JSONResponse(protocol.completion_response(response_id, server.model_name, outputs, req.n))


def _top_logprobs(req: SamplingRequest) -> int:
    """The alternatives a chat answer lists per token: its ``top_logprobs`` (0 if it asked for none)."""
    return req.num_logprobs() or 0


async def _collect(events: asyncio.Queue, count: int) -> list[RequestOutput]:
    final: dict[int, RequestOutput] = {}
    while len(final) < count:
        sub, event = await events.get()
        if isinstance(event, APIError):
            raise event
        if event.finished:
            final[sub.prompt_index] = event
    return [final[i] for i in range(count)]


async def _until_done_or_gone(
    request: Request, work: Coroutine[Any, Any, list[RequestOutput]]
) -> list[RequestOutput] | None:
    """``work``'s result, or None if the client disconnects first."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task.done() and not task.cancelled() else None


async def _stream(
    events: asyncio.Queue,
    subs: list[Submission],
    req: SamplingRequest,
    response_id: str,
    model: str,
    chat: bool,
    include_usage: bool,
) -> AsyncIterator[str]:
    """Server-sent events: a chunk per choice whenever its text grows; an error event if the engine fails."""
    choices = _Choices(req, response_id, model, chat)
    final: dict[int, RequestOutput] = {}
    if chat:
        for i in range(req.n):
            yield protocol.sse(protocol.stream_chunk(response_id, model, chat, i, None, None))
    while len(final) < len(subs):
        try:
            latest = await _latest_outputs(events)
        except APIError as error:  # the engine failed: say so, and end the stream
            yield protocol.sse(error.body())
            yield protocol.sse("[DONE]")
            return
        for prompt_index, out in sorted(latest.items()):
            for chunk in choices.chunks(prompt_index, out):
                yield chunk
            if out.finished:
                final[prompt_index] = out
    if include_usage:
        yield protocol.sse(protocol.usage_chunk(response_id, model, chat, [final[i] for i in range(len(subs))]))
    yield protocol.sse("[DONE]")


async def _latest_outputs(events: asyncio.Queue) -> dict[int, RequestOutput]:
    """Prompt index -> its newest output, from the next event and all those queued behind it (a
    client that fell behind is sent only the latest text of each request); an engine error is raised."""
    batch = [await events.get()]
    while not events.empty():
        batch.append(events.get_nowait())
    latest: dict[int, RequestOutput] = {}
    for sub, event in batch:
        if isinstance(event, APIError):
            raise event
        latest[sub.prompt_index] = event
    return latest


class _Choices:
    """The choices of one streamed response: the text and logprobs each has been sent so far, and
    those finished. A token's logprobs go with the first chunk sent after it arrived."""

    def __init__(self, req: SamplingRequest, response_id: str, model: str, chat: bool) -> None:
        self.req, self.response_id, self.model, self.chat = req, response_id, model, chat
        self.texts: dict[int, TextStream] = {}  # choice index -> what it was sent (stop strings held back)
        self.logprobs: dict[int, LogprobsStream] = {}  # choice index -> the tokens whose logprobs it was sent
        self.closed: set[int] = set()  # choices whose last chunk was sent

    def chunks(self, prompt_index: int, out: RequestOutput) -> Iterator[str]:
        """A chunk per choice of ``out`` whose text grew or that just finished."""
        for c in out.outputs:
            index = protocol.choice_index(prompt_index, c.index, self.req.n)
            if index in self.closed:
                continue
            done = c.finish_reason is not None
            piece = self.texts.setdefault(index, TextStream(self.req.stop_strings)).delta(c.text, done)
            if piece or done:
                lp = self.logprobs.setdefault(index, LogprobsStream(self.chat, _top_logprobs(self.req))).delta(c)
                chunk = protocol.stream_chunk(
                    self.response_id, self.model, self.chat, index, piece, c.finish_reason, lp
                )
                yield protocol.sse(chunk)
            if done:
                self.closed.add(index)
