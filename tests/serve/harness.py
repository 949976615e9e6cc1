"""A real server for the tests: the app on uvicorn, on 127.0.0.1 and a free port, in a thread.

The server runs in the test's process, so a test can read the engine loop's own record (which
step an abort was applied at, how many frames it published) and inject one fault into the real
model. Tests synchronise on what the server does (a frame published after the request ended, a
request handed to the engine loop, an abort asked for), never on how long something took; every
wait also has a hang guard (``HANG``), far longer than any correct run needs, so that a hung
server fails its test instead of stalling the suite.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn

ENGINE = dict(num_kvcache_blocks=96, max_num_seqs=16, enable_prefix_caching=True)
HANG = 300  # seconds: a hang guard for any one wait (no correct run, however busy the machine, comes near it)


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
        wait_until(lambda: self.server.started or not self.thread.is_alive(), what="the test server to start")
        if not self.server.started:
            raise RuntimeError("the test server's thread ended before it started serving")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(HANG)

    @property
    def loop(self):
        return self.app.state.server.loop

    @property
    def llm(self):
        return self.app.state.server.llm


def metrics(url: str, headers: dict | None = None) -> dict[str, float]:
    """``GET /metrics`` as {name without the minipaged: prefix: value}."""
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=HANG)
    r.raise_for_status()
    text = r.text
    out = {}
    for line in text.splitlines():
        if line.startswith("minipaged:"):
            name, value = line.split()
            out[name.removeprefix("minipaged:")] = float(value)
    return out


def wait_until(condition, timeout: float = HANG, what: str = "the condition") -> None:
    """Poll ``condition`` until it holds; ``timeout`` is a hang guard, not a speed limit."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s (a hang guard: the server is stuck)")
        time.sleep(0.05)


def wait_idle(server: ServerThread, num_blocks: int, headers: dict | None = None) -> dict[str, float]:
    """Wait until the engine runs nothing and every block is free; returns the metrics then.

    ``/metrics`` reports what the engine thread last published. A publication from before the
    test's last request ended also looks idle (nothing had started yet), so only figures
    published after this call count: the engine thread publishes every 0.2 s while it runs,
    at once when it goes idle and about once a second while idle, so a fresh one always comes.
    """
    start = server.loop.live.frame_no
    seen = {}

    def idle() -> bool:
        if server.loop.live.frame_no <= start:  # nothing published since the call
            return False
        seen.update(metrics(server.url, headers))
        return (
            seen["num_requests_running"] == 0
            and seen["num_requests_waiting"] == 0
            and seen["num_free_blocks"] == num_blocks
        )

    wait_until(idle, what="an idle engine with every block free")
    return seen


@contextlib.contextmanager
def replaced(obj, name: str, value) -> Iterator[None]:
    """``obj.name`` is ``value`` within the block; afterwards ``obj`` is as it was (a method of
    its class again, not a copy of it kept on the instance)."""
    own = vars(obj).get(name, _ABSENT)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if own is _ABSENT:
            delattr(obj, name)
        else:
            setattr(obj, name, own)


_ABSENT = object()


@contextlib.contextmanager
def together(server: ServerThread, count: int) -> Iterator[None]:
    """Within the block, the engine's steps wait until ``count`` requests have reached the engine
    loop: requests sent at once then run at once, however the machine schedules the threads that
    send them (otherwise a short request can finish before the last one is even sent)."""
    arrived, lock, seen = threading.Event(), threading.Lock(), [0]
    submit, forward = server.loop.submit, server.llm.model.forward

    def counted(sub) -> None:
        submit(sub)
        with lock:
            seen[0] += 1
            if seen[0] >= count:
                arrived.set()

    def held(*args, **kwargs):
        if not arrived.wait(HANG):
            raise RuntimeError(f"hang guard: only {seen[0]} of {count} requests reached the engine loop")
        return forward(*args, **kwargs)

    with replaced(server.loop, "submit", counted), replaced(server.llm.model, "forward", held):
        yield


@contextlib.contextmanager
def held_until_abort(server: ServerThread) -> Iterator[threading.Event]:
    """Within the block, once a request has its first token, the engine's next forward pass waits
    until the server asks for an abort: a request whose client leaves cannot run to its end before
    the server notices. Yields an event set when such a pass has begun (the request is running)."""
    asked, running = threading.Event(), threading.Event()
    loop, forward = server.loop, server.llm.model.forward
    abort = loop.abort

    def aborting(sub) -> None:
        abort(sub)
        asked.set()

    def held(*args, **kwargs):
        if any(sub.num_tokens for sub in loop._requests.values()):  # the engine thread's own record
            running.set()
            if not asked.wait(HANG):
                raise RuntimeError("hang guard: the server never asked for an abort")
        return forward(*args, **kwargs)

    with replaced(loop, "abort", aborting), replaced(server.llm.model, "forward", held):
        yield running


# Installed in a page before it loads (``page.add_init_script``): both pages set body's data-frame
# at the end of drawing a frame, so a mutation observer sees each frame as it was drawn, before
# anything can replace it (a mutation observer runs right after the task that drew the frame).
# ``window.drawn`` keeps them all: a test looks for the frame it needs among every frame drawn,
# rather than hoping to catch it on the screen.
RECORD_FRAMES_JS = """
window.drawn = [];
new MutationObserver(() => {
  const pool = document.querySelector("#pool, #mine-pool");
  const rects = pool ? [...pool.querySelectorAll("rect")] : [];
  window.drawn.push({
    frame: Number(document.body.dataset.frame),
    states: rects.map((r) => r.dataset.state),
    mine: rects.filter((r) => r.classList.contains("mine")).length,
    running: document.querySelectorAll("#running li").length,
  });
}).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-frame"] });
"""


def recording_page(browser):
    """A new page of ``browser`` (a Playwright context) that records every frame it draws."""
    page = browser.new_page()
    page.add_init_script(RECORD_FRAMES_JS)
    return page
