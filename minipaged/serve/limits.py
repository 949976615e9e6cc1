"""Limits that keep one classroom from stalling the server, each with a flag and a default.

- request body size: a body over ``max_body_bytes`` is refused with 413 before it is read whole;
- prompt length and ``max_tokens``: over the caps, 400 (checked with the engine's own limits:
  ``max_model_len``, the vocabulary, ``max_num_seqs``);
- requests in flight per client address: over the cap, 429. By default 8 when the server
  listens beyond this machine, none on loopback (every client is then this machine);
- requests queued (submitted, not yet running) over ``max_queued_requests``: 503 with
  ``Retry-After``, so that a client backs off instead of waiting behind hundreds.

Admission counts live on the event loop's thread only, so they need no lock.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minipaged.serve.protocol import APIError

PER_CLIENT_OFF_LOOPBACK = 8


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None  # None: max_model_len - 1
    max_tokens: int = 256
    max_requests_per_client: int | None = None  # None: PER_CLIENT_OFF_LOOPBACK, or no cap on loopback
    max_queued_requests: int = 128
    retry_after_s: int = 2

    def per_client(self, loopback: bool) -> int | None:
        if self.max_requests_per_client is not None:
            return self.max_requests_per_client or None  # 0 switches the cap off
        return None if loopback else PER_CLIENT_OFF_LOOPBACK


class Admission:
    """Who may queue how many requests right now; a ticket is returned when its request ends."""

    def __init__(self, limits: Limits, loopback: bool) -> None:
        self.limits = limits
        self.per_client = limits.per_client(loopback)
        self.by_client: Counter = Counter()
        self.in_flight = 0  # engine requests submitted and not finished

    def admit(self, client: str, count: int, running: int) -> Ticket:
        """``count`` engine requests for ``client``; ``running``: requests the engine runs now."""
        if self.per_client is not None and self.by_client[client] + count > self.per_client:
            raise APIError(
                429,
                f"too many requests at once from {client}: at most {self.per_client} in flight per client; "
                f"wait for one to finish",
            )
        queued = self.in_flight - running
        if queued + count > self.limits.max_queued_requests:
            raise APIError(
                503,
                f"the server is busy: {max(queued, 0)} requests are queued (at most "
                f"{self.limits.max_queued_requests}); retry in {self.limits.retry_after_s} s",
                headers={"Retry-After": str(self.limits.retry_after_s)},
            )
        self.by_client[client] += count
        self.in_flight += count
        return Ticket(self, client, count)


class Ticket:
    def __init__(self, admission: Admission, client: str, count: int) -> None:
        self.admission, self.client, self.count = admission, client, count

    def release(self) -> None:
        """Idempotent: the request ended (finished, failed, or its client left)."""
        if self.count:
            self.admission.by_client[self.client] -= self.count
            if self.admission.by_client[self.client] <= 0:
                del self.admission.by_client[self.client]
            self.admission.in_flight -= self.count
            self.count = 0


class BodySizeLimit:
    """ASGI middleware: 413 for a body over ``max_bytes``, by its Content-Length or while it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = APIError(413, f"body: larger than {self.max_bytes} bytes (the server's --max-body-bytes)")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await send_error(send, too_big)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except BodyTooLarge:
            await send_error(send, too_big)


class BodyTooLarge(Exception):
    pass


async def send_error(send: Send, error: APIError) -> None:
    """Answer an ASGI request with an OpenAI-style JSON error, before any app code ran."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
