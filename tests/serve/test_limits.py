"""Safe on a classroom network: the join code (401), requests per client (429), the queue (503)."""

from __future__ import annotations

import threading

import httpx
import pytest
from serve.harness import ENGINE, HANG, ServerThread, wait_idle, wait_until

from minipaged import LLM
from minipaged.serve.access import is_loopback, new_join_code
from minipaged.serve.app import create_app
from minipaged.serve.limits import PER_CLIENT_OFF_LOOPBACK, Limits

openai = pytest.importorskip("openai")

GOOD = {"prompt": "abc<copy>hi<end>", "max_tokens": 4, "temperature": 0}
LONG = {"prompt": "abc<copy>x<end>", "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True}


def test_loopback_and_join_codes():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.20")
    code = new_join_code()
    assert len(code) == 6 and not set(code) & set("01OI")
    assert Limits().per_client(loopback=True) is None
    assert Limits().per_client(loopback=False) == PER_CLIENT_OFF_LOOPBACK
    assert Limits(max_requests_per_client=0).per_client(loopback=False) is None


@pytest.fixture(scope="module")
def coded():
    app = create_app(LLM(**ENGINE), model_name="tiny-copy", join_code="K7M2QX", loopback=False)
    with ServerThread(app) as s:
        yield s


@pytest.mark.parametrize(
    "path,kwargs",
    [
        ("/v1/completions", {"headers": {}}),
        ("/v1/completions", {"headers": {"Authorization": "Bearer WRONG1"}}),
        ("/v1/completions", {"params": {"code": "k7m2qx"}}),  # codes are case-sensitive
        ("/v1/models", {"headers": {"X-Join-Code": "nope"}}),
        ("/", {}),
        ("/try", {}),
        ("/metrics", {}),
        ("/projector/stream", {}),
    ],
)
def test_a_wrong_or_missing_join_code_is_401(coded, path, kwargs):
    method = "POST" if path == "/v1/completions" else "GET"
    r = httpx.request(method, f"{coded.url}{path}", json=GOOD if method == "POST" else None, timeout=HANG, **kwargs)
    assert r.status_code == 401
    assert r.json()["error"]["param"] == "join_code" and "join code" in r.json()["error"]["message"]


def test_the_right_join_code_opens_everything(coded):
    c = openai.OpenAI(base_url=f"{coded.url}/v1", api_key="K7M2QX", max_retries=0, timeout=HANG)
    assert c.completions.create(model="tiny-copy", **GOOD).choices[0].text == "hi"
    assert httpx.get(f"{coded.url}/try", params={"code": "K7M2QX"}, timeout=HANG).status_code == 200
    assert httpx.get(f"{coded.url}/v1/models", headers={"X-Join-Code": "K7M2QX"}, timeout=HANG).status_code == 200
    assert httpx.get(f"{coded.url}/static/live.js", timeout=HANG).status_code == 200  # the same for everybody


def held_engine(**engine) -> tuple[LLM, threading.Event]:
    """A real engine whose steps wait for the test to open a gate: its requests stay in flight."""
    llm = LLM(**{**ENGINE, **engine})
    gate, forward = threading.Event(), llm.model.forward

    def held(*args, **kwargs):
        if not gate.wait(HANG):  # a test that never opens its gate fails instead of hanging
            raise RuntimeError("hang guard: the test never opened the gate")
        return forward(*args, **kwargs)

    llm.model.forward = held
    return llm, gate


def returned(s: ServerThread) -> None:
    """Wait until the server has taken back every admission ticket: the stream left behind ends on
    the event loop (its client left), which may come after the engine has freed its blocks."""
    admission = s.app.state.server.admission
    wait_until(lambda: admission.in_flight == 0, what="every admission ticket back")


def test_too_many_requests_from_one_client_is_429():
    llm, gate = held_engine()
    app = create_app(llm, model_name="tiny-copy", limits=Limits(max_requests_per_client=1))
    with ServerThread(app) as s, httpx.Client(timeout=HANG) as c:
        with c.stream("POST", f"{s.url}/v1/completions", json=LONG) as first:
            r = c.post(f"{s.url}/v1/completions", json=GOOD)
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
            gate.set()
            assert first.status_code == 200
        wait_idle(s, ENGINE["num_kvcache_blocks"])
        returned(s)
        assert c.post(f"{s.url}/v1/completions", json=GOOD).status_code == 200  # its ticket came back


def test_a_full_queue_is_503_with_retry_after():
    llm, gate = held_engine(max_num_seqs=1)
    app = create_app(llm, model_name="tiny-copy", limits=Limits(max_queued_requests=1))
    with ServerThread(app) as s, httpx.Client(timeout=HANG) as c:
        with c.stream("POST", f"{s.url}/v1/completions", json=LONG) as queued:
            r = c.post(f"{s.url}/v1/completions", json=GOOD)
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            assert "busy" in r.json()["error"]["message"]
            gate.set()
            assert queued.status_code == 200
        wait_idle(s, ENGINE["num_kvcache_blocks"])
        returned(s)
        assert c.post(f"{s.url}/v1/completions", json=GOOD).json()["choices"][0]["text"] == "hi"
