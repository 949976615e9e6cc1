"""Stop rules as vLLM's: stop strings (the text cut before them), stop token ids (even with
``ignore_eos``), and what each step hands back for streaming."""

from __future__ import annotations

import pytest

from minipaged import LLM, SamplingParams
from minipaged.tiny.task import prompt_for


@pytest.fixture(scope="module")
def llm():
    return LLM(block_size=4, num_kvcache_blocks=64)


def test_a_stop_string_cuts_the_text_before_it(llm):
    out = llm.generate([prompt_for("hello blocks", "")], SamplingParams(temperature=0, stop=["lo b"]), use_tqdm=False)
    c = out[0].outputs[0]
    assert (c.text, c.finish_reason, c.stop_reason) == ("hel", "stop", "lo b")
    assert llm.tokenizer.decode(c.token_ids) == "hello b"  # generation stopped where the string was complete
    first = llm.generate([prompt_for("abcabc", "")], SamplingParams(temperature=0, stop=["ca", "b"]), use_tqdm=False)
    assert first[0].outputs[0].text == "a" and first[0].outputs[0].stop_reason == "b"  # the earliest match


def test_stop_token_ids_stop_even_when_eos_is_ignored(llm):
    space = llm.tokenizer.encode(" ")[0]
    params = SamplingParams(temperature=0, ignore_eos=True, stop_token_ids=[space], max_tokens=30)
    c = llm.generate([prompt_for("paged kv cache", "")], params, use_tqdm=False)[0].outputs[0]
    assert (c.text, c.finish_reason, c.stop_reason) == ("paged", "stop", space)
    eos = SamplingParams(temperature=0, max_tokens=30)
    c = llm.generate([prompt_for("kv", "")], eos, use_tqdm=False)[0].outputs[0]
    assert (c.text, c.finish_reason, c.stop_reason) == ("kv", "stop", None)


def test_bad_stop_fields_are_refused_before_queuing(llm, tiny_model_dir):
    with pytest.raises(ValueError, match=r"stop\[1\] must be a non-empty string"):
        SamplingParams(stop=["x", ""])
    with pytest.raises(ValueError, match=r"stop_token_ids\[0\] must be >= 0"):
        SamplingParams(stop_token_ids=[-1])
    with pytest.raises(ValueError, match="stop_token_ids outside the vocabulary"):
        llm.generate(["x"], SamplingParams(stop_token_ids=[100000]), use_tqdm=False)
    no_tokenizer = LLM(tiny_model_dir, max_model_len=64)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        no_tokenizer.generate([[1, 2]], SamplingParams(stop="x"), use_tqdm=False)
    assert not llm.has_unfinished_requests() and not no_tokenizer.has_unfinished_requests()


def test_each_step_hands_back_the_requests_it_advanced(llm):
    params = SamplingParams(temperature=0, max_tokens=6)
    a = llm.add_request(prompt_for("abc", ""), params)
    b = llm.add_request(prompt_for("a long text to copy", ""), params)
    texts: dict[int, list[str]] = {a: [], b: []}
    finished = []
    while llm.has_unfinished_requests():
        outputs = llm.step()
        for out in outputs:
            texts[out.request_id].append(out.outputs[0].text)
        finished += [o.request_id for o in outputs if o.finished]
    assert texts[a] == ["a", "ab", "abc", "abc"]  # the last step appended the EOS: text unchanged, finished
    assert texts[b] == ["a", "a ", "a l", "a lo", "a lon", "a long"]
    assert finished == [a, b]
