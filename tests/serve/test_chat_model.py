"""The real chat model behind ``python -m minipaged serve``: chats through the official ``openai``
client equal ``LLM.generate`` on the rendered prompt, the lesson's system prompt is shared by every
student's chat (the projector's frames say ``ref_cnt`` N), and ``/try`` is a chat box.

The server is made by the CLI itself (uvicorn's ``run`` replaced by a recorder), then served on
loopback for the tests. The model is loaded twice per module: the server's and the reference.
"""

from __future__ import annotations

import json
import threading

import pytest
from serve.harness import HANG, ServerThread, recording_page, replaced, together

from minipaged import LLM, SamplingParams
from minipaged.__main__ import main
from minipaged.serve.cli import served_name
from minipaged.serve.inputs import LESSON_SYSTEM_PROMPT

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow
ENGINE = dict(num_kvcache_blocks=160, max_num_seqs=8, max_model_len=1024)
QUESTION = {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
STUDENTS = 4


@pytest.fixture(scope="module")
def classroom(real_model):
    served = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("uvicorn.run", lambda app, **kw: served.update(app=app))
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
        main(["serve", real_model, *flags])
    with ServerThread(served["app"]) as s:
        yield s


@pytest.fixture(scope="module")
def reference(real_model):
    return LLM(real_model, dtype="float32", enable_prefix_caching=True, **ENGINE)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="any", max_retries=0, timeout=HANG)


def generate(llm: LLM, messages: list[dict], max_tokens: int) -> tuple[str, int]:
    """(LLM.generate's greedy text, prompt tokens) on the chat as the server lays it out."""
    text = llm.tokenizer.chat_template.render([{"role": "system", "content": LESSON_SYSTEM_PROMPT}, *messages])
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)[0]
    return out.outputs[0].text, len(ids)


def test_the_cli_serves_the_chat_model_with_the_lessons_system_prompt(classroom, real_model):
    server = classroom.app.state.server
    assert server.model_name == served_name(real_model)
    assert server.llm.config.enable_prefix_caching
    assert server.inputs.preamble == LESSON_SYSTEM_PROMPT
    # SmolLM2's template: 103 tokens before the student's text, 6 full blocks of 16
    assert server.shared_prefix_tokens == 103


def test_chats_equal_llm_generate_on_the_rendered_prompt(classroom, reference):
    c, name = client(classroom.url), classroom.app.state.server.model_name
    want, prompt_tokens = generate(reference, [QUESTION], 16)
    got = c.chat.completions.create(model=name, messages=[QUESTION], max_tokens=16, temperature=0)
    assert got.choices[0].message.content == want and got.usage.prompt_tokens == prompt_tokens
    print(f"\nanswer: {want!r}")
    later = [QUESTION, {"role": "assistant", "content": want}, {"role": "user", "content": "And of Italy?"}]
    for messages in ([QUESTION], later):
        want, _ = generate(reference, messages, 16)
        stream = c.chat.completions.create(model=name, messages=messages, max_tokens=16, temperature=0, stream=True)
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
        assert len([ch for ch in chunks if ch.choices[0].delta.content]) > 1  # it streamed, piece by piece


@pytest.mark.parametrize(
    "messages,match",
    [
        ([], "at least one message"),
        ([{"role": "robot", "content": "hi"}], "messages"),
        ([{"role": "user", "content": "hi " * 1100}], "over the server's limit"),
    ],
)
def test_bad_chats_are_400_and_say_why(classroom, messages, match):
    name = classroom.app.state.server.model_name
    with pytest.raises(openai.BadRequestError, match=match):
        client(classroom.url).chat.completions.create(model=name, messages=messages, max_tokens=4)


def test_every_students_chat_holds_the_system_prompts_blocks(classroom):
    """N students chat at once: the projector's frames show the first 6 blocks of each request the
    same blocks, held N times (ref_cnt N); the block after is each student's own."""
    live, block_size = classroom.loop.live, classroom.loop.live.block_size
    k = classroom.app.state.server.shared_prefix_tokens // block_size
    name = classroom.app.state.server.model_name
    labels = [f"student{i}" for i in range(STUDENTS)]

    def chat(label: str) -> None:
        question = {"role": "user", "content": f"I am {label}. What is a KV cache?"}
        client(classroom.url).chat.completions.create(
            model=name, messages=[question], max_tokens=24, temperature=0, user=label, extra_body={"ignore_eos": True}
        )

    # every frame the engine thread publishes, kept here as it is published (live.frames keeps only
    # the last few, and a slow machine publishes many while four answers run)
    published: dict[int, str] = {}
    publish = live.publish

    def recorded(*args, **kwargs) -> None:
        publish(*args, **kwargs)
        number, text = live.frames[-1]
        published[number] = text

    threads = [threading.Thread(target=chat, args=(label,)) for label in labels]
    with replaced(live, "publish", recorded), together(classroom, STUDENTS):  # all four run at once
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG)
        assert not any(t.is_alive() for t in threads), "hang guard: the students' chats did not end"

    def all_students_running(frame: dict) -> bool:
        running = [r for r in frame["running"] if r["label"] in labels and len(r["samples"][0]["blocks"]) > k]
        return len(running) == STUDENTS

    seen = [f for f in (json.loads(published[n]) for n in sorted(published)) if all_students_running(f)]
    assert seen, f"none of {len(published)} frames shows {STUDENTS} students' chats running together"
    frame = seen[0]
    tables = [r["samples"][0]["blocks"] for r in frame["running"] if r["label"] in labels]
    lesson = tables[0][:k]
    assert all(t[:k] == lesson for t in tables)
    assert [frame["blocks"][b][0] for b in lesson] == [STUDENTS] * k
    assert len({t[k] for t in tables}) == STUDENTS  # the block holding each student's text is their own


@pytest.mark.browser
def test_try_is_a_chat_box(browser, classroom, reference):
    page = recording_page(browser)
    page.goto(f"{classroom.url}/try")
    page.wait_for_function("document.querySelectorAll('#mine-pool rect').length > 0")
    assert page.inner_text("#title").startswith("Chat with") and "system prompt" in page.inner_text("#preamble-note")
    page.fill("#name", "ana")
    page.fill("#max-tokens", "12")
    said: list[dict] = []
    for turn, text in enumerate([QUESTION["content"], "And of Italy?"]):
        page.fill("#text", text)
        page.click("#send")
        # the turn is over when the page clears the box and lets the student send again (or shows an error)
        page.wait_for_function(
            "(!document.getElementById('send').disabled && document.getElementById('text').value === '')"
            " || document.querySelector('#transcript li.error') !== null",
            polling=100,
        )
        assert page.query_selector("#transcript li.error") is None, page.inner_text("#transcript")
        assert page.eval_on_selector_all("#transcript li", "els => els.length") == 2 * turn + 2
        said.append({"role": "user", "content": text})
        want, _ = generate(reference, said, 12)
        replies = page.eval_on_selector_all("#transcript li.assistant", "els => els.map(e => e.textContent)")
        assert replies[-1] == want  # the whole chat was sent: the second answer knows the first
        said.append({"role": "assistant", "content": want})
    # while it answered, a frame drawn on the pool outlined this student's blocks
    page.wait_for_function("window.drawn.some((f) => f.mine > 0)", polling=100)
    page.close()
