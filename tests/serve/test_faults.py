"""Things that go wrong: a client that leaves mid-stream, and an engine step that raises.

A real engine each time; the fault is one dropped connection, or one injected failure of the
model's forward pass.
"""

from __future__ import annotations

import socket

import httpx
import pytest
from serve.harness import ENGINE, HANG, ServerThread, held_until_abort, wait_idle, wait_until

from minipaged import LLM, SamplingParams
from minipaged.serve.app import create_app
from minipaged.tiny import task

openai = pytest.importorskip("openai")

LONG = dict(max_tokens=250, temperature=0, ignore_eos=True)  # runs for hundreds of steps unless aborted


@pytest.fixture
def held_server():
    """A server of its own whose engine, once a request has its first token, waits for the abort
    (see ``held_until_abort``): the client's leaving, not the machine's speed, ends the request."""
    with ServerThread(create_app(LLM(**ENGINE), model_name="tiny-copy")) as s, held_until_abort(s) as running:
        yield s, running


def test_a_client_that_leaves_mid_stream_is_aborted_within_one_step(held_server):
    server, _ = held_server
    with httpx.Client(timeout=HANG) as c:
        with c.stream(
            "POST", f"{server.url}/v1/completions", json=dict(prompt="abc<copy>x<end>", stream=True, **LONG)
        ) as r:
            first = next(r.iter_lines())
            assert first.startswith("data: ")
        # leaving the with-blocks closes the connection
    wait_until(lambda: len(server.loop.abort_log) > 0, what="the abort")
    request_id, asked, applied = server.loop.abort_log[-1]
    assert applied - asked <= 1  # applied before the next step, or right after the one running then
    m = wait_idle(server, ENGINE["num_kvcache_blocks"])
    assert m["requests_aborted_total"] == 1 and m["requests_finished_total"] == 0
    assert m["generation_tokens_total"] < LONG["max_tokens"]


def test_a_client_that_leaves_a_request_without_streaming_frees_it(held_server):
    """Without streaming, and with the connection dropped at the socket."""
    server, running = held_server
    body = b'{"prompt": "abc<copy>x<end>", "max_tokens": 250, "temperature": 0, "ignore_eos": true}'
    with socket.create_connection(("127.0.0.1", server.port), timeout=HANG) as s:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        s.sendall(head.encode() + body)
        assert running.wait(HANG), "hang guard: the request never ran"
    wait_until(lambda: len(server.loop.abort_log) > 0, what="the abort")
    m = wait_idle(server, ENGINE["num_kvcache_blocks"])
    assert m["requests_aborted_total"] == 1 and m["requests_finished_total"] == 0


def test_a_failed_step_fails_only_its_requests_and_the_server_goes_on(offline):
    llm = LLM(**ENGINE)
    forward = llm.model.forward
    calls = {"n": 0}

    def fails_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return forward(*args, **kwargs)

    llm.model.forward = fails_once
    prompt = task.prompt_for("after the fault")
    want = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0].outputs[0].text
    with ServerThread(create_app(llm, model_name="tiny-copy")) as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=HANG)
        with pytest.raises(openai.InternalServerError, match="injected fault"):
            c.completions.create(model="tiny-copy", prompt=prompt, max_tokens=20, temperature=0)
        m = wait_idle(s, ENGINE["num_kvcache_blocks"])
        assert m["failed_steps_total"] == 1 and m["requests_failed_total"] == 1
        got = c.completions.create(model="tiny-copy", prompt=prompt, max_tokens=20, temperature=0)
        assert got.choices[0].text == want
        assert httpx.get(f"{s.url}/health", timeout=HANG).json()["status"] == "ok"
        wait_idle(s, ENGINE["num_kvcache_blocks"])


def test_a_failed_step_mid_stream_sends_an_error_event(offline):
    llm = LLM(**ENGINE)
    forward = llm.model.forward
    calls = {"n": 0}

    def fails_on_the_fifth(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("injected fault")
        return forward(*args, **kwargs)

    llm.model.forward = fails_on_the_fifth
    with ServerThread(create_app(llm, model_name="tiny-copy")) as s:
        c = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=HANG)
        stream = c.completions.create(
            model="tiny-copy", prompt="abc<copy>x<end>", stream=True, extra_body={"ignore_eos": True}, max_tokens=40
        )
        with pytest.raises(openai.APIError, match="injected fault"):
            for _ in stream:
                pass
        wait_idle(s, ENGINE["num_kvcache_blocks"])
