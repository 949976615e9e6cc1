"""The engine loop: one thread owns the engine and steps it for every client at once.

``LLM`` is not thread-safe, so exactly one thread touches it. HTTP handlers run on the asyncio
event loop and never call the engine: they put commands (add a request, abort one) on a
thread-safe queue, and receive what the engine produced on an ``asyncio.Queue`` of their own.

Each turn of the loop::

    apply every queued command (add_request / abort_request)   <- between steps, never during one
    step() once, for every running request together           <- continuous batching
    hand each request its output so far                       <- one call_soon_threadsafe per step
    every FRAME_INTERVAL: a new projector frame and /metrics figures

A thread rather than an asyncio task: ``step()`` is blocking compute. torch releases the GIL
while it computes, so the event loop keeps accepting connections and streaming tokens while the
engine thread runs the model. An abort asked for during a step is applied right after it: a
disconnected client's blocks are free before the next step.

If ``step()`` raises, only the requests that step ran fail: their clients get a 500 error, the
requests are aborted (their blocks freed), and the loop goes on with the others. (A step that
fails while running none of them would only fail again: then every request queued fails.)

The loop steps the engine itself (:meth:`LLM.engine_step`) and draws from what the step handed
back: its ``outputs`` are what ``llm.step()`` returns (every request that got a token, with its
output so far), and its snapshot for the projector is built from that record and the pool
summary (:func:`minipaged.viz.snapshot.take_snapshot`); after a failed step,
``llm.failed_request_ids`` names the requests it ran.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from minipaged.engine.llm import LLM
from minipaged.engine.outputs import RequestOutput
from minipaged.engine.sampling_params import SamplingParams
from minipaged.serve.live import LiveState
from minipaged.serve.protocol import APIError
from minipaged.viz.snapshot import take_snapshot

log = logging.getLogger("minipaged.serve")


@dataclass(eq=False)
class Submission:
    """One engine request as the server follows it (a completion with k prompts makes k).

    ``queue`` belongs to the HTTP request and receives ``(submission, RequestOutput | APIError)``.
    """

    prompt: str | list[int]
    params: SamplingParams
    queue: asyncio.Queue
    label: str = ""
    prompt_index: int = 0
    num_prompt_tokens: int = 0
    arrival: float = field(default_factory=time.monotonic)
    request_id: int | None = None
    first_token: float | None = None
    num_tokens: int = 0  # output tokens of all its samples so far
    done: bool = False
    abort_asked_at_step: int | None = None


_STOP = object()


class EngineLoop:
    """Owns ``llm`` on a thread of its own; ``submit`` and ``abort`` may be called from any thread."""

    def __init__(self, llm: LLM, event_loop: asyncio.AbstractEventLoop) -> None:
        self.llm = llm
        self.live = LiveState(llm)
        self._event_loop = event_loop
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[int, Submission] = {}  # request id -> its submission, while unfinished
        self._outbox: list[tuple[Submission, RequestOutput | APIError]] = []
        self.num_steps = 0
        self._labelled_started = False  # this turn's step started a labelled request (see _run)
        self.num_running_requests = 0  # after the last step; read by admission control
        self.abort_log: deque[tuple[int, int | None, int]] = deque(maxlen=256)  # (request id, step asked, step applied)
        self._thread = threading.Thread(target=self._run, name="minipaged-engine", daemon=True)

    # -- called from the event loop --------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30) -> None:
        self._commands.put(_STOP)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, sub: Submission) -> None:
        self._commands.put(("add", sub))

    def abort(self, sub: Submission) -> None:
        """Stop a submission (its client left); harmless if it already finished."""
        if sub.done or sub.abort_asked_at_step is not None:
            return
        sub.abort_asked_at_step = self.num_steps
        self._commands.put(("abort", sub))

    # -- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        self.live.publish(self.llm, time.monotonic(), force=True)
        while True:
            idle = not self.llm.has_unfinished_requests()
            try:
                command = self._commands.get(timeout=1.0) if idle else self._commands.get_nowait()
            except queue.Empty:
                command = None
            while command is not None:
                if command is _STOP:
                    self._shutdown()
                    return
                try:
                    self._apply(*command)
                except Exception:  # a bug here must not stop the engine for everyone
                    log.exception("engine command %s failed", command[0])
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            self._labelled_started = False
            if self.llm.has_unfinished_requests():
                self._step()
            self._flush()
            # a frame at once when a labelled request (a student's, from /try) gets its first token:
            # a short one can come and go between two timed frames, and its owner would never see it
            force = self._labelled_started or not self.llm.has_unfinished_requests()
            try:
                self.live.publish(self.llm, time.monotonic(), force=force)
            except Exception:  # a broken picture must not stop the engine either
                log.exception("projector frame failed")

    def _apply(self, kind: str, sub: Submission) -> None:
        if kind == "add":
            if sub.abort_asked_at_step is not None:  # the client left before its request was queued
                sub.done = True
                return
            try:
                sub.request_id = self.llm.add_request(sub.prompt, sub.params)
            except (ValueError, TypeError) as e:  # checked before submission; a last guard
                self._fail(sub, APIError(400, f"prompt: {e}", "prompt"))
                return
            except Exception as e:  # the client gets an answer whatever happened
                self._fail(sub, APIError(500, f"the engine could not take the request ({type(e).__name__}: {e})"))
                return
            self._requests[sub.request_id] = sub
            self.live.added(sub.request_id, sub.label, sub.num_prompt_tokens)
        elif sub.request_id in self._requests:
            self.llm.abort_request(sub.request_id)
            del self._requests[sub.request_id]
            sub.done = True
            self.abort_log.append((sub.request_id, sub.abort_asked_at_step, self.num_steps))
            self.live.totals["requests_aborted"] += 1

    def _step(self) -> None:
        try:
            out = self.llm.engine_step(pool=True)
        except Exception as e:  # one bad step fails its own requests, never the server
            log.exception("engine step %d failed", self.num_steps)
            self.live.totals["failed_steps"] += 1
            failed = [r for r in self.llm.failed_request_ids if r in self._requests]
            # a step that fails with nothing to blame would fail again at once: fail everything queued
            failed = failed or list(self._requests)
            if failed:
                self.llm.abort_request(failed)
            for rid in failed:
                message = f"the engine failed while running this request ({type(e).__name__}: {e}); it was aborted"
                self._fail(self._requests.pop(rid), APIError(500, message))
            return
        self.num_steps += 1
        now = time.monotonic()
        new_tokens = 0
        for request in out.outputs:
            sub = self._requests.get(request.request_id)
            if sub is None:
                continue
            count = sum(len(c.token_ids) for c in request.outputs)
            new_tokens += count - sub.num_tokens
            if count and sub.first_token is None:
                sub.first_token = now
                self._labelled_started = self._labelled_started or bool(sub.label)
                self.live.first_token(now - sub.arrival)
            sub.num_tokens = count
            if request.finished:
                sub.done = True
                del self._requests[request.request_id]
                self.live.totals["requests_finished"] += 1
            self._outbox.append((sub, request))
        self.num_running_requests = out.num_running_requests
        assert out.pool is not None  # asked for
        self.live.observe(take_snapshot(out, out.pool), new_tokens, now)

    def _fail(self, sub: Submission, error: APIError) -> None:
        sub.done = True
        self.live.totals["requests_failed"] += 1
        self._outbox.append((sub, error))

    def _flush(self) -> None:
        """Hand this turn's outputs to the event loop in one call (one wake-up per step)."""
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []
        try:
            self._event_loop.call_soon_threadsafe(_deliver, batch)
        except RuntimeError:  # the event loop is closed: the server is going down
            pass

    def _shutdown(self) -> None:
        if self._requests:
            self.llm.abort_request(list(self._requests))
        for sub in self._requests.values():
            self._fail(sub, APIError(503, "the server is shutting down"))
        self._requests.clear()
        self._flush()


def _deliver(batch: list[tuple[Submission, RequestOutput | APIError]]) -> None:
    for sub, event in batch:
        sub.queue.put_nowait((sub, event))
