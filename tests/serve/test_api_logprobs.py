"""Log-probabilities over HTTP: completions' ``logprobs: k`` and chat's ``logprobs: true`` +
``top_logprobs: k``, in OpenAI's two shapes, equal to ``LLM.generate``'s entries, streamed or not."""

from __future__ import annotations

import json
import math
import shutil

import httpx
import pytest
from serve.harness import ENGINE, HANG, ServerThread

from minipaged import LLM, SamplingParams
from minipaged.model.chat_template import ChatTemplate
from minipaged.model.loader import EMBEDDED_MODEL_DIR
from minipaged.serve.app import create_app
from minipaged.tiny import task

PROMPT = task.prompt_for("kv cache")
TEMPLATE = "{% for m in messages %}<copy>{{ m.content }}<end>{% endfor %}"  # the copy model's prompt
MESSAGES = [{"role": "user", "content": "paged"}]


def post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(f"{url}{path}", json=body, timeout=HANG)
    assert r.status_code == 200, r.text
    return r.json()


def stream(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True}, timeout=HANG) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, abs_tol=1e-4)


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    """The embedded model with a chat template, behind a server; and an engine like it."""
    folder = tmp_path_factory.mktemp("chatty")
    shutil.copytree(EMBEDDED_MODEL_DIR, folder, dirs_exist_ok=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    app = create_app(LLM(folder, **ENGINE), model_name="chatty", chat_template=ChatTemplate.from_folder(folder))
    with ServerThread(app) as s:
        yield s, LLM(folder, **ENGINE)


def test_completions_logprobs_are_the_engines_in_openais_shape(server, offline):
    body = dict(model="tiny-copy", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=2)
    got = post(server.url, "/v1/completions", body)["choices"][0]
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=2)
    want = offline.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    lp = got["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert lp["tokens"] == [e[t].decoded_token for t, e in zip(want.token_ids, want.logprobs)]
    assert all(close(a, e[t].logprob) for a, t, e in zip(lp["token_logprobs"], want.token_ids, want.logprobs))
    for top, entry in zip(lp["top_logprobs"], want.logprobs):
        assert len(top) in (2, 3)  # the top 2, and the token itself
        assert all(close(top[lp.decoded_token], lp.logprob) for lp in entry.values())
    lengths = [len(t) for t in lp["tokens"]]
    assert lp["text_offset"] == [sum(lengths[:i]) for i in range(len(lengths))]
    assert "".join(lp["tokens"][:-1]) == got["text"]  # the last token is the end of sequence


def test_streamed_completions_logprobs_add_up_to_the_answer(server):
    body = dict(model="tiny-copy", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=3, n=2, logprobs=1)
    whole = post(server.url, "/v1/completions", body)["choices"]
    parts: dict[int, dict[str, list]] = {}
    for chunk in stream(server.url, "/v1/completions", body):
        for c in chunk["choices"]:
            for key, values in (c["logprobs"] or {}).items():
                parts.setdefault(c["index"], {}).setdefault(key, []).extend(values)
    assert [parts[c["index"]] for c in whole] == [c["logprobs"] for c in whole]


def test_completions_without_logprobs_answer_null(server):
    got = post(server.url, "/v1/completions", dict(prompt=PROMPT, max_tokens=3))
    assert got["choices"][0]["logprobs"] is None
    assert all(c["choices"][0]["logprobs"] is None for c in stream(server.url, "/v1/completions", dict(prompt=PROMPT)))


def chat_item(token: int, lp) -> dict:
    return {"token": lp.decoded_token, "logprob": lp.logprob, "bytes": list(lp.decoded_token.encode())}


def items_close(got: list[dict], want: list[dict]) -> None:
    assert [{**g, "logprob": 0} for g in got] == [{**w, "logprob": 0} for w in want]
    assert all(close(g["logprob"], w["logprob"]) for g, w in zip(got, want))


def test_chat_logprobs_are_the_engines_in_openais_shape(chat_server):
    server, offline = chat_server
    body = dict(model="chatty", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    got = post(server.url, "/v1/chat/completions", body)["choices"][0]
    rendered = "<copy>paged<end>"  # the template's rendering of MESSAGES
    want = offline.generate(rendered, SamplingParams(temperature=0, max_tokens=8, logprobs=3), use_tqdm=False)
    c = want[0].outputs[0]
    content = got["logprobs"]["content"]
    assert got["message"]["content"] == c.text == "paged"
    assert len(content) == len(c.token_ids)
    for item, token, entry in zip(content, c.token_ids, c.logprobs):
        top = sorted(entry.items(), key=lambda kv: kv[1].rank)[:3]
        items_close([{k: v for k, v in item.items() if k != "top_logprobs"}], [chat_item(token, entry[token])])
        items_close(item["top_logprobs"], [chat_item(t, lp) for t, lp in top])
        values = [t["logprob"] for t in item["top_logprobs"]]
        assert values == sorted(values, reverse=True)


def test_streamed_chat_logprobs_add_up_to_the_answer(chat_server):
    server, _ = chat_server
    body = dict(model="chatty", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True)
    whole = post(server.url, "/v1/chat/completions", body)["choices"][0]["logprobs"]["content"]
    assert all(item["top_logprobs"] == [] for item in whole)  # top_logprobs left out: 0 alternatives
    chunks = stream(server.url, "/v1/chat/completions", body)
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role's chunk carries no token
    assert [i for ch in chunks for i in (ch["choices"][0]["logprobs"] or {}).get("content", [])] == whole


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/completions", dict(logprobs=-1), "logprobs"),
        ("/v1/completions", dict(logprobs=True), "logprobs"),
        ("/v1/completions", dict(logprobs=2, top_logprobs=2), "top_logprobs"),  # a chat field
        ("/v1/chat/completions", dict(top_logprobs=2), "top_logprobs"),  # needs logprobs: true
        ("/v1/chat/completions", dict(logprobs=True, top_logprobs=21), "top_logprobs"),
        ("/v1/chat/completions", dict(logprobs=3), "logprobs"),  # a bool on chat
    ],
)
def test_bad_counts_are_400_naming_the_field(server, path, body, field):
    """Checked with the other fields, before the prompt is (these chats would fail later: no template)."""
    base = dict(prompt=PROMPT) if path == "/v1/completions" else dict(messages=MESSAGES)
    r = httpx.post(f"{server.url}{path}", json={**base, **body}, timeout=HANG)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert r.json()["error"]["message"].startswith(field)


def test_the_openai_client_reads_both_shapes(server, chat_server):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=HANG)
    got = c.completions.create(model="tiny-copy", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1)
    lp = got.choices[0].logprobs
    assert "".join(lp.tokens) == got.choices[0].text == "kv c" and len(lp.text_offset) == 4
    chat = openai.OpenAI(base_url=f"{chat_server[0].url}/v1", api_key="none", max_retries=0, timeout=HANG)
    got = chat.chat.completions.create(
        model="chatty", messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    content = got.choices[0].logprobs.content
    assert "".join(t.token for t in content) == got.choices[0].message.content == "pag"
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.logprob for t in content)
