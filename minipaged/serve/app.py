"""The HTTP server: an OpenAI-compatible API, the projector page and ``/try``, over one engine.

:func:`create_app` wraps an ``LLM`` in a FastAPI application (served by uvicorn, as vLLM's
server is). Routes:

- ``POST /v1/completions``, ``POST /v1/chat/completions`` (:mod:`minipaged.serve.completions`),
  ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (:mod:`minipaged.serve.metrics`);
- ``GET /`` the projector page, ``GET /try`` the students' page, ``GET /projector/stream`` the
  frames both pages draw, pushed as server-sent events, ``GET /projector/config``.

Every error, whatever raised it, is answered as an OpenAI-style JSON error (never a stack
trace); the engine loop runs on, so the next request is served.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from minipaged.engine.llm import LLM
from minipaged.model.chat_template import ChatTemplate
from minipaged.serve import metrics, projector
from minipaged.serve.access import JoinCode
from minipaged.serve.completions import EngineStream, router
from minipaged.serve.engine_loop import EngineLoop
from minipaged.serve.inputs import EngineInputs
from minipaged.serve.limits import Admission, BodySizeLimit, Limits
from minipaged.serve.live import LiveState
from minipaged.serve.protocol import APIError

STATIC = Path(__file__).with_name("static")
PUSH_INTERVAL = 0.05  # seconds between checks for a new projector frame
KEEPALIVE = 10.0  # seconds between comments on an idle projector stream
log = logging.getLogger("minipaged.serve")


class Server:
    """Everything the handlers share: the engine loop, the checks, admission control."""

    def __init__(
        self,
        llm: LLM,
        model_name: str,
        limits: Limits,
        loopback: bool,
        preamble: str | None,
        chat_template: ChatTemplate | None,
    ) -> None:
        self.llm, self.model_name = llm, model_name
        self.inputs = EngineInputs(llm, limits, preamble, chat_template)
        self.shared_prefix_tokens = self.inputs.shared_prefix_tokens()
        self.admission = Admission(limits, loopback)
        self.loop: EngineLoop | None = None
        self.metrics = metrics.registry(lambda: self.loop.live.stats if self.loop else {})
        self.created = int(time.time())

    @property
    def running_loop(self) -> EngineLoop:
        """The engine loop, which the app's lifespan starts before any request is served."""
        if self.loop is None:
            raise RuntimeError("the server's engine loop has not started")
        return self.loop

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"model: '{name}' is not served here; this server serves '{self.model_name}'", "model")


def create_app(
    llm: LLM,
    *,
    model_name: str = "minipaged",
    limits: Limits | None = None,
    loopback: bool = True,
    join_code: str | None = None,
    preamble: str | None = None,
    chat_template: ChatTemplate | None = None,
) -> FastAPI:
    """The application; its engine loop starts and stops with the server (ASGI lifespan).
    ``chat_template`` defaults to the model's own (its tokenizer's). ``preamble``: the lesson's
    prompt, a chat model's system message (see :mod:`minipaged.serve.inputs`)."""
    limits = limits or Limits()
    if chat_template is None and llm.tokenizer is not None:
        chat_template = llm.tokenizer.chat_template
    server = Server(llm, model_name, limits, loopback, preamble, chat_template)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.loop = EngineLoop(llm, asyncio.get_running_loop())
        server.loop.start()
        try:
            yield
        finally:
            server.loop.stop()

    # no /docs: its page loads scripts from a CDN, and a classroom may have no internet
    app = FastAPI(title="minipaged", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.include_router(router)
    app.add_middleware(BodySizeLimit, max_bytes=limits.max_body_bytes)
    if join_code is not None:
        app.add_middleware(JoinCode, code=join_code)  # added last: runs first
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _errors(app)
    _routes(app, server)
    return app


def _errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = f"path: no {request.method} {request.url.path} here" if e.status_code in (404, 405) else e.detail
        return JSONResponse(APIError(e.status_code, str(message), "path").body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        log.exception("error while serving %s", request.url.path)
        message = f"internal error ({type(e).__name__}); the server goes on: try again"
        return JSONResponse(APIError(500, message).body(), status_code=500)


def _routes(app: FastAPI, server: Server) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        if server.loop is None or not server.loop.alive:
            return JSONResponse(APIError(503, "the engine loop is not running").body(), status_code=503)
        return JSONResponse({"status": "ok", "steps": server.loop.num_steps})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {
            "id": server.model_name,
            "object": "model",
            "created": server.created,
            "owned_by": "minipaged",
            "max_model_len": server.inputs.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(server.metrics), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/")
    async def projector_page() -> FileResponse:
        return FileResponse(STATIC / "projector.html")

    @app.get("/try")
    async def try_page() -> FileResponse:
        return FileResponse(STATIC / "try.html")

    @app.get("/projector/config")
    async def projector_config() -> JSONResponse:
        live = server.running_loop.live
        return JSONResponse(
            {
                "model": server.model_name,
                "num_blocks": live.num_blocks,
                "block_size": live.block_size,
                "layout": live.layout,
                "max_model_len": server.inputs.max_model_len,
                "preamble": server.inputs.preamble,
                "preamble_tokens": server.shared_prefix_tokens,
                "copy_model": server.inputs.copy_model,
                "chat": server.inputs.chat_template is not None,
                "palette": projector.page_palette(),
            }
        )

    @app.get("/projector/stream")
    async def projector_stream() -> EngineStream:
        return EngineStream(_projector_frames(server.running_loop.live), on_close=lambda: None)


async def _projector_frames(live: LiveState) -> AsyncIterator[str]:
    """The projector frames as server-sent events, each sent once (the few kept first); a comment while idle."""
    sent, quiet = 0, 0.0
    while True:
        fresh = [(n, text) for n, text in live.frames if n > sent]
        for n, text in fresh:
            yield f"data: {text}\n\n"
            sent = n
        quiet = 0.0 if fresh else quiet + PUSH_INTERVAL
        if quiet >= KEEPALIVE:  # a comment line keeps proxies from closing an idle stream
            yield ": idle\n\n"
            quiet = 0.0
        await asyncio.sleep(PUSH_INTERVAL)
