"""Bad input over HTTP: each kind gets a 4xx OpenAI-style JSON error that names the field, and
the server stays healthy: after all of them, the next request is served as before."""

from __future__ import annotations

import httpx
import pytest
from serve.harness import ENGINE, HANG, ServerThread, wait_idle

from minipaged import LLM, SamplingParams
from minipaged.serve.app import create_app
from minipaged.serve.limits import Limits
from minipaged.tiny import task

GOOD = {"prompt": "abc<copy>hello<end>", "max_tokens": 8, "temperature": 0}
VOCAB = 260
MAX_MODEL_LEN = 1024


def with_(**changes) -> dict:
    body = dict(GOOD)
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


# (id, path, body as bytes or a dict, status, the field the message must name)
CASES = [
    ("malformed JSON", "/v1/completions", b'{"prompt": "a",', 400, "body"),
    ("not UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, "body"),
    ("a JSON list", "/v1/completions", b"[1, 2]", 400, "body"),
    ("a JSON string", "/v1/completions", b'"hello"', 400, "body"),
    ("empty body", "/v1/completions", b"", 400, "body"),
    ("deeply nested JSON", "/v1/completions", b"[" * 30_000 + b"]" * 30_000, 400, "body"),
    ("no prompt", "/v1/completions", with_(prompt=...), 400, "prompt"),
    ("prompt a number", "/v1/completions", with_(prompt=42), 400, "prompt"),
    ("prompt empty string", "/v1/completions", with_(prompt=""), 400, "prompt"),
    ("prompt empty list", "/v1/completions", with_(prompt=[]), 400, "prompt"),
    ("token ids with a bool", "/v1/completions", with_(prompt=[True, 1]), 400, "prompt"),
    ("token ids with a float", "/v1/completions", with_(prompt=[97, 1.5]), 400, "prompt"),
    ("token ids mixed with text", "/v1/completions", with_(prompt=[97, "a"]), 400, "prompt"),
    ("token id out of vocabulary", "/v1/completions", with_(prompt=[97, VOCAB + 5]), 400, "prompt"),
    ("negative token id", "/v1/completions", with_(prompt=[97, -1]), 400, "prompt"),
    ("prompt over max_model_len", "/v1/completions", with_(prompt="a" * (MAX_MODEL_LEN + 10)), 400, "prompt"),
    ("max_tokens negative", "/v1/completions", with_(max_tokens=-3), 400, "max_tokens"),
    ("max_tokens zero", "/v1/completions", with_(max_tokens=0), 400, "max_tokens"),
    ("max_tokens huge", "/v1/completions", with_(max_tokens=10**30), 400, "max_tokens"),
    ("max_tokens a string", "/v1/completions", with_(max_tokens="8"), 400, "max_tokens"),
    ("max_tokens a float", "/v1/completions", with_(max_tokens=8.5), 400, "max_tokens"),
    (
        "prompt + max_tokens over max_model_len",
        "/v1/completions",
        with_(prompt="a" * 1000, max_tokens=100),
        400,
        "max_tokens",
    ),
    ("temperature NaN", "/v1/completions", b'{"prompt": "a", "temperature": NaN}', 400, "temperature"),
    ("temperature Infinity", "/v1/completions", b'{"prompt": "a", "temperature": Infinity}', 400, "temperature"),
    ("temperature negative", "/v1/completions", with_(temperature=-1), 400, "temperature"),
    ("top_p zero", "/v1/completions", with_(top_p=0), 400, "top_p"),
    ("top_p over 1", "/v1/completions", with_(top_p=1.5), 400, "top_p"),
    ("top_k below -1", "/v1/completions", with_(top_k=-5), 400, "top_k"),
    ("seed negative", "/v1/completions", with_(seed=-1), 400, "seed"),
    ("seed over 2**64", "/v1/completions", with_(seed=2**70), 400, "seed"),
    ("n zero", "/v1/completions", with_(n=0), 400, "n"),
    ("n over max_num_seqs", "/v1/completions", with_(n=ENGINE["max_num_seqs"] + 1), 400, "n"),
    ("stream not a bool", "/v1/completions", with_(stream="yes"), 400, "stream"),
    ("ignore_eos a string", "/v1/completions", with_(ignore_eos="true"), 400, "ignore_eos"),
    ("stream_options wrong", "/v1/completions", with_(stream_options={"include_usage": 1}), 400, "stream_options"),
    ("stop a number", "/v1/completions", with_(stop=5), 400, "stop"),
    ("stop empty", "/v1/completions", with_(stop=[""]), 400, "stop"),
    ("stop_token_ids out of vocabulary", "/v1/completions", with_(stop_token_ids=[VOCAB]), 400, "stop_token_ids"),
    ("an unknown field (a typo)", "/v1/completions", with_(max_token=8), 400, "max_token"),
    ("logprobs over the cap", "/v1/completions", with_(logprobs=21), 400, "logprobs"),
    ("a penalty (not supported)", "/v1/completions", with_(presence_penalty=0.5), 400, "presence_penalty"),
    ("best_of over 1", "/v1/completions", with_(best_of=3), 400, "best_of"),
    ("another model", "/v1/completions", with_(model="gpt-4"), 404, "model"),
    ("chat: no messages field", "/v1/chat/completions", {"model": "tiny-copy"}, 400, "messages"),
    (
        "chat: a made-up role",
        "/v1/chat/completions",
        {"messages": [{"role": "robot", "content": "hi"}]},
        400,
        "messages",
    ),
    (
        "chat: without a template",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}]},
        400,
        "messages",
    ),
    ("oversize body", "/v1/completions", with_(prompt="a" * 70_000), 413, "body"),
    ("an unknown path", "/v1/nothing", GOOD, 404, "path"),
]
BODY_LIMIT = 64_000


@pytest.fixture(scope="module")
def strict_server():
    app = create_app(LLM(**ENGINE), model_name="tiny-copy", limits=Limits(max_body_bytes=BODY_LIMIT))
    with ServerThread(app) as s:
        yield s


def check_error(r: httpx.Response, status: int, field: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["code"] == status and error["type"] and "Traceback" not in error["message"]
    assert error["message"].startswith(field) or f"'{field}'" in error["message"], error["message"]


@pytest.mark.parametrize("name,path,body,status,field", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_json_error_naming_the_field(strict_server, name, path, body, status, field):
    content = body if isinstance(body, bytes) else None
    kwargs = (
        {"content": content, "headers": {"Content-Type": "application/json"}} if content is not None else {"json": body}
    )
    check_error(httpx.post(f"{strict_server.url}{path}", timeout=HANG, **kwargs), status, field)


def test_the_wrong_method_is_405(strict_server):
    check_error(httpx.get(f"{strict_server.url}/v1/completions", timeout=HANG), 405, "path")


def test_a_chunked_body_over_the_limit_is_413(strict_server):
    def pieces():
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"a" * 5000
        yield b'"}'

    r = httpx.post(f"{strict_server.url}/v1/completions", content=pieces(), timeout=HANG)
    check_error(r, 413, "body")


def test_after_every_bad_input_the_next_request_is_served(strict_server):
    for _, path, body, _, _ in CASES:  # all of them again, back to back
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        assert 400 <= httpx.post(f"{strict_server.url}{path}", timeout=HANG, **kwargs).status_code < 500
    assert httpx.get(f"{strict_server.url}/health", timeout=HANG).json()["status"] == "ok"
    got = httpx.post(f"{strict_server.url}/v1/completions", json=GOOD, timeout=HANG).json()
    want = LLM(**ENGINE).generate(GOOD["prompt"], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert got["choices"][0]["text"] == want[0].outputs[0].text == "hello"
    m = wait_idle(strict_server, ENGINE["num_kvcache_blocks"])
    assert m["requests_failed_total"] == 0 and m["requests_finished_total"] >= 1


def test_a_prompt_over_the_servers_cap_is_400():
    app = create_app(LLM(**ENGINE), model_name="tiny-copy", limits=Limits(max_prompt_tokens=20, max_tokens=8))
    with ServerThread(app) as s:
        check_error(httpx.post(f"{s.url}/v1/completions", json=with_(prompt="a" * 21), timeout=HANG), 400, "prompt")
        check_error(httpx.post(f"{s.url}/v1/completions", json=with_(max_tokens=9), timeout=HANG), 400, "max_tokens")
        r = httpx.post(f"{s.url}/v1/completions", json=with_(prompt=task.prompt_for("hi")), timeout=HANG)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "hi"
