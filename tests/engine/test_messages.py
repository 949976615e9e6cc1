"""``LLM.chat``: conversations checked, rendered with a chat template, generated like prompts.

The fast tests drive the embedded copy model with a template passed in (``chat_template=``): it
copies the text between ``<copy>`` and ``<end>``, so the template below makes it answer with
the last message. The slow ones load the real chat model (SmolLM2-135M-Instruct) once.
"""

from __future__ import annotations

import pytest

from minipaged import LLM, SamplingParams
from minipaged.engine.messages import as_conversations

# The copy model's "chat template": the conversation as a preamble, then the last message to copy.
COPY_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if messages[-1]['role'] != 'user' %}{{ raise_exception('the last message must be the user') }}{% endif %}"
    "<copy>{{ messages[-1]['content'] }}<end>"
)
GREEDY = SamplingParams(temperature=0, max_tokens=32)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


@pytest.fixture(scope="module")
def copy_llm() -> LLM:
    return LLM(enable_prefix_caching=True)


def test_one_conversation_or_a_list():
    one = [{"role": "system", "content": "be brief"}, user("hi")]
    assert as_conversations(one) == [one]
    assert as_conversations([one, [user("x")]]) == [one, [user("x")]]


BAD = {
    "a string": ("hello", TypeError, "messages must be a conversation"),
    "one dict": (user("hi"), TypeError, "messages must be a conversation"),
    "no conversation": ([], TypeError, "messages must be a conversation"),
    "an empty conversation": ([[user("a")], []], ValueError, "conversation 1: a conversation needs at least one"),
    "no content": ([{"role": "user"}], TypeError, "message 0 must be a dict with 'role' and 'content'"),
    "a string in a conversation": ([user("a"), "b"], TypeError, "message 1 must be a dict"),
    "an unknown role": ([user("a"), {"role": "robot", "content": "b"}], ValueError, "message 1 has role 'robot'"),
    "content not a string": ([{"role": "user", "content": 7}], TypeError, "content must be a string, got int 7"),
    "a conversation not a list": ([[user("a")], "b"], TypeError, "conversation 1: a conversation must be a list"),
}


@pytest.mark.parametrize("messages, error, says", BAD.values(), ids=BAD.keys())
def test_bad_messages_are_refused_before_anything_is_queued(copy_llm, messages, error, says):
    with pytest.raises(error, match=says):
        copy_llm.chat(messages, GREEDY, chat_template=COPY_TEMPLATE)
    assert not copy_llm.has_unfinished_requests()


def test_a_model_without_a_template_cannot_chat(copy_llm):
    with pytest.raises(ValueError, match="this model has no chat template, so it cannot chat.*smollm2-135m-instruct"):
        copy_llm.chat([user("hello")], GREEDY)
    assert not copy_llm.has_unfinished_requests()


def test_a_template_that_refuses_says_which_conversation(copy_llm):
    good, bad = [user("abc")], [user("abc"), {"role": "assistant", "content": "abc"}]
    with pytest.raises(ValueError, match=r"conversation 1: .*refused them \(the last message must be the user\)"):
        copy_llm.chat([good, bad], GREEDY, chat_template=COPY_TEMPLATE)
    assert not copy_llm.has_unfinished_requests()


def test_a_broken_template_is_refused(copy_llm):
    with pytest.raises(ValueError, match="chat_template is not a valid Jinja template"):
        copy_llm.chat([user("abc")], GREEDY, chat_template="{% for m in messages %}")


def test_chat_is_generate_on_the_rendered_prompt(copy_llm):
    chats = [[{"role": "system", "content": "copy it"}, user("hello blocks")], [user("paged kv 2026")]]
    outs = copy_llm.chat(chats, GREEDY, use_tqdm=False, chat_template=COPY_TEMPLATE)
    assert [o.outputs[0].text for o in outs] == ["hello blocks", "paged kv 2026"]
    assert outs[0].prompt == "system: copy it\nuser: hello blocks\n<copy>hello blocks<end>"
    want = copy_llm.generate([o.prompt for o in outs], GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [w.prompt_token_ids for w in want]
    assert [o.outputs[0].token_ids for o in outs] == [w.outputs[0].token_ids for w in want]
    # one conversation alone gives what it gave in the list; one SamplingParams each works too
    [alone] = copy_llm.chat(chats[1], [GREEDY], use_tqdm=False, chat_template=COPY_TEMPLATE)
    assert alone.outputs[0].token_ids == outs[1].outputs[0].token_ids


def test_one_sampling_params_per_conversation_or_refused(copy_llm):
    with pytest.raises(ValueError, match="1 sampling params for 2 prompts"):
        copy_llm.chat([[user("a")], [user("b")]], [GREEDY], chat_template=COPY_TEMPLATE)


# -- the real chat model -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_llm(real_model) -> LLM:
    return LLM(real_model, dtype="float32", enable_prefix_caching=True)


@pytest.mark.slow
def test_the_real_model_knows_the_capital_of_france(real_llm):
    question = [user("What is the capital of France? Answer in one sentence.")]
    [out] = real_llm.chat(question, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    assert out.outputs[0].text == "The capital of France is Paris."
    assert out.outputs[0].finish_reason == "stop"  # it ended with <|im_end|>
    # the template added its default system prompt; the rendered text's special tokens are single ids
    assert out.prompt is not None and out.prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant")
    assert out.prompt_token_ids[0] == 1 and out.prompt_token_ids.count(1) == 3  # <|im_start|>, not a BOS too


@pytest.mark.slow
def test_real_chat_is_generate_on_the_rendered_ids(real_llm):
    chats = [
        [{"role": "system", "content": "Answer briefly."}, user("Name a colour.")],
        [user("What is 2 + 2?")],
    ]
    params = SamplingParams(temperature=0, max_tokens=6)
    outs = real_llm.chat(chats, params, use_tqdm=False)
    want = real_llm.generate([o.prompt_token_ids for o in outs], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [w.outputs[0].token_ids for w in want]
    encoded = real_llm.tokenizer.encode(outs[1].prompt, add_special_tokens=False)
    assert outs[1].prompt_token_ids == encoded
    [alone] = real_llm.chat(chats[1], params, use_tqdm=False)
    assert alone.outputs[0].token_ids == outs[1].outputs[0].token_ids
