"""The join code: who may use a server that listens beyond this machine.

On loopback (the default) only this machine can connect, and no code is needed. With ``--host``
anything else, every request must carry the class's join code (``--join-code``, or one made up
and printed at start): as ``Authorization: Bearer CODE`` (what the ``openai`` client sends as
its ``api_key``), an ``X-Join-Code`` header, or ``?code=CODE`` in the URL (what the pages use:
``http://HOST:8000/try?code=CODE``). A wrong or missing code gets 401.

The static files (the pages' scripts and styles, the same for everybody) are served without it.
"""

from __future__ import annotations

import ipaddress
import secrets
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from minipaged.serve.limits import send_error
from minipaged.serve.protocol import APIError

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O or 1/I: read aloud, typed from a projector
PUBLIC_PREFIX = "/static/"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_join_code(length: int = 6) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


def presented_code(scope: Scope) -> str | None:
    """The code a request carries, wherever it carries it."""
    headers = dict(scope["headers"])
    auth = headers.get(b"authorization", b"").decode("latin-1")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    if b"x-join-code" in headers:
        return headers[b"x-join-code"].decode("latin-1").strip()
    codes = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("code")
    return codes[0] if codes else None


class JoinCode:
    """ASGI middleware: 401 unless the request carries ``code`` (static files excepted)."""

    def __init__(self, app: ASGIApp, code: str) -> None:
        self.app, self.code = app, code

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(PUBLIC_PREFIX):
            given = presented_code(scope)
            if given is None or not secrets.compare_digest(given.encode(), self.code.encode()):
                what = "a wrong join code" if given else "no join code"
                message = (
                    f"join code: this server needs the class's join code and got {what}; send it as "
                    f"'Authorization: Bearer CODE' (the openai client's api_key) or add ?code=CODE to the URL"
                )
                return await send_error(send, APIError(401, message, "join_code"))
        await self.app(scope, receive, send)
