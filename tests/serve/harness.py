"""A real server for the tests: the app on uvicorn, on 127.0.0.1 and a free port, in a thread.

The server runs in the test's process, so a test can read the engine loop's own record (which
step an abort was applied at) and inject one fault into the real model. Every wait is bounded.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import uvicorn

ENGINE = dict(num_kvcache_blocks=96, max_num_seqs=16, enable_prefix_caching=True)
START_TIMEOUT = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """``with ServerThread(app) as url:`` serves ``app`` until the block ends."""

    def __init__(self, app) -> None:
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def loop(self):
        return self.app.state.server.loop


def metrics(url: str, headers: dict | None = None) -> dict[str, float]:
    """``GET /metrics`` as {name without the minipaged: prefix: value}."""
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    r.raise_for_status()
    text = r.text
    out = {}
    for line in text.splitlines():
        if line.startswith("minipaged:"):
            name, value = line.split()
            out[name.removeprefix("minipaged:")] = float(value)
    return out


def wait_until(condition, timeout: float = 30, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        time.sleep(0.05)


def wait_idle(url: str, num_blocks: int, headers: dict | None = None) -> dict[str, float]:
    """Wait until the engine runs nothing and every block is free; returns the metrics then."""
    seen = {}

    def idle() -> bool:
        seen.update(metrics(url, headers))
        return (
            seen["num_requests_running"] == 0
            and seen["num_requests_waiting"] == 0
            and seen["num_free_blocks"] == num_blocks
        )

    wait_until(idle, what="an idle engine with every block free")
    return seen
