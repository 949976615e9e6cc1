"""The API through the official ``openai`` client: the same text as ``LLM.generate``, streamed or not."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest
from serve.harness import ENGINE, HANG, ServerThread, wait_idle

from minipaged import LLM, SamplingParams
from minipaged.model.chat_template import ChatTemplate
from minipaged.model.loader import EMBEDDED_MODEL_DIR
from minipaged.serve.app import create_app
from minipaged.tiny import task

openai = pytest.importorskip("openai")

PROMPTS = [
    task.prompt_for(t, p) for t, p in [("hello paged", "system: copy. "), ("kv cache 2026", ""), ("ab", "x" * 40)]
]


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=HANG)


def expected(offline: LLM, prompts, **params) -> list[list[str]]:
    outs = offline.generate(prompts, SamplingParams(**params), use_tqdm=False)
    return [[c.text for c in o.outputs] for o in outs]


def streamed(stream) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    return texts


@pytest.mark.parametrize("params", [dict(temperature=0), dict(temperature=0.9, top_p=0.9, seed=7)])
def test_completions_equal_llm_generate(server, offline, params):
    want = expected(offline, PROMPTS, max_tokens=24, **params)
    c = client(server.url)
    for prompt, texts in zip(PROMPTS, want):
        got = c.completions.create(model="tiny-copy", prompt=prompt, max_tokens=24, **params)
        assert [ch.text for ch in got.choices] == texts
        assert got.usage.prompt_tokens == len(offline.tokenizer.encode(prompt))


@pytest.mark.parametrize("params", [dict(temperature=0), dict(temperature=1.0, seed=3, n=3)])
def test_streamed_completions_equal_llm_generate(server, offline, params):
    n = params.get("n", 1)
    want = expected(offline, PROMPTS, max_tokens=24, ignore_eos=True, **params)
    c = client(server.url)
    for prompt, texts in zip(PROMPTS, want):
        stream = c.completions.create(
            model="tiny-copy", prompt=prompt, max_tokens=24, stream=True, extra_body={"ignore_eos": True}, **params
        )
        got = streamed(stream)
        assert [got[i] for i in range(n)] == texts


def test_a_list_of_prompts_and_token_ids(server, offline):
    ids = offline.tokenizer.encode(PROMPTS[1])
    want = expected(offline, [PROMPTS[0], ids], max_tokens=16, temperature=0)
    got = client(server.url).completions.create(model="tiny-copy", prompt=[PROMPTS[0]], max_tokens=16, temperature=0)
    assert [c.text for c in got.choices] == want[0]
    got = client(server.url).completions.create(model="tiny-copy", prompt=ids, max_tokens=16, temperature=0)
    assert [c.text for c in got.choices] == want[1]
    body = dict(prompt=[PROMPTS[0], PROMPTS[1]], max_tokens=16, temperature=0)
    got = httpx.post(f"{server.url}/v1/completions", json=body, timeout=HANG).json()
    assert [c["index"] for c in got["choices"]] == [0, 1]
    assert [c["text"] for c in got["choices"]] == [want[0][0], want[1][0]]


def test_streamed_usage_counts_every_token(server, offline):
    want = offline.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)[0]
    stream = client(server.url).completions.create(
        model="tiny-copy", prompt=PROMPTS[0], max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == len(want.outputs[0].token_ids)
    assert chunks[-1].usage.prompt_tokens == len(want.prompt_token_ids)
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == want.outputs[0].finish_reason


def test_models_health_and_metrics(server):
    models = client(server.url).models.list()
    assert [m.id for m in models.data] == ["tiny-copy"]
    assert httpx.get(f"{server.url}/health", timeout=HANG).json()["status"] == "ok"
    m = wait_idle(server, ENGINE["num_kvcache_blocks"])
    assert m["num_blocks"] == ENGINE["num_kvcache_blocks"]
    for name in ("prefix_hit_tokens_total", "num_preemptions_total", "generation_tokens_total", "prompt_tokens_total"):
        assert name in m


def test_a_wrong_model_name_is_404(server):
    with pytest.raises(openai.NotFoundError, match="tiny-copy"):
        client(server.url).completions.create(model="gpt-4", prompt="a", max_tokens=2)


def test_chat_without_a_template_is_400_and_says_why(server):
    with pytest.raises(openai.BadRequestError, match="chat template"):
        client(server.url).chat.completions.create(model="tiny-copy", messages=[{"role": "user", "content": "hi"}])


TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}<copy>{% endif %}"
)


def test_chat_with_a_template_equals_generate_on_the_rendered_prompt(tmp_path):
    folder = tmp_path / "chatty"
    shutil.copytree(EMBEDDED_MODEL_DIR, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    llm = LLM(folder, **ENGINE)
    messages = [{"role": "system", "content": "copy"}, {"role": "user", "content": "abc<end>"}]
    rendered = "[system]copy[user]abc<end><copy>"
    assert ChatTemplate.from_folder(folder).render(messages) == rendered
    want = LLM(folder, **ENGINE).generate(rendered, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    app = create_app(llm, model_name="chatty", chat_template=ChatTemplate.from_folder(folder))
    with ServerThread(app) as s:
        c = client(s.url)
        got = c.chat.completions.create(model="chatty", messages=messages, max_tokens=12, temperature=0)
        assert got.choices[0].message.content == want[0].outputs[0].text
        stream = c.chat.completions.create(model="chatty", messages=messages, max_tokens=12, temperature=0, stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == want[0].outputs[0].text


def test_the_preamble_is_the_lesson_prompt_and_its_blocks_are_shared(offline):
    preamble = "You are a careful copy machine. Repeat the text between the markers. " * 2  # 142 chars
    app = create_app(LLM(**ENGINE), model_name="tiny-copy", preamble=preamble)
    with ServerThread(app) as s:
        c = client(s.url)
        for text in ("first student", "second student"):
            got = c.completions.create(model="tiny-copy", prompt=text, max_tokens=20, temperature=0)
            want = expected(offline, [task.prompt_for(text, preamble)], max_tokens=20, temperature=0)
            assert got.choices[0].text == want[0][0] == text
        # the second request found the preamble's full blocks in the prefix cache (the figures
        # published once both had ended: /metrics right after the answer may predate them)
        m = wait_idle(s, ENGINE["num_kvcache_blocks"])
        assert m["requests_finished_total"] == 2
        assert m["prefix_hit_tokens_total"] == (len(preamble) // 16) * 16


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text(server, offline, stream):
    prompt = task.prompt_for("abcdef ghij")
    c = client(server.url)
    got = c.completions.create(
        model="tiny-copy", prompt=prompt, max_tokens=20, temperature=0, stop=["ef"], stream=stream
    )
    text = streamed(got)[0] if stream else got.choices[0].text
    assert text == "abcd"


def test_stop_token_ids_stop(server):
    prompt = task.prompt_for("abcdef")
    got = client(server.url).completions.create(
        model="tiny-copy", prompt=prompt, max_tokens=20, temperature=0, extra_body={"stop_token_ids": [ord("d")]}
    )
    # the stop token ends the text and is not part of it, like the model's own end-of-sequence token
    assert got.choices[0].text == "abc" and got.choices[0].finish_reason == "stop"


def test_a_request_shaped_like_vllms_benchmark_is_accepted(server):
    """The fields vLLM's serving benchmark sends (vllm/benchmarks/lib/endpoint_request_func.py)."""
    prompt = task.prompt_for("from the benchmark")
    body = {
        "model": "tiny-copy",
        "prompt": prompt,
        "repetition_penalty": 1.0,
        "max_tokens": 20,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=HANG) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20  # ignore_eos held
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "length"
