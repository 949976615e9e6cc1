"""The GGUF's tokenizer, rebuilt from its metadata, against transformers' GGUF tokenizer on ShareGPT."""

from __future__ import annotations

import re

import pytest

from minipaged.model.gguf_reader import metadata, open_gguf
from minipaged.model.gguf_tokenizer import build_tokenizer, byte_alphabet

EMOJI = re.compile("[\U0001f300-\U0001faff\u2600-\u27bf]")


def kinds(texts: list[str]) -> dict[str, int]:
    """How many texts hold non-English letters, emoji, code."""
    return {
        "non-English": sum(any(c.isalpha() and not c.isascii() for c in s) for s in texts),
        "emoji": sum(bool(EMOJI.search(s)) for s in texts),
        "code": sum("```" in s or "def " in s or "#include" in s for s in texts),
    }


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    return build_tokenizer(metadata(open_gguf(gguf_path)), eos_token_id=2)


def test_byte_alphabet_is_gpt2s():
    spelling = byte_alphabet()
    assert len(set(spelling.values())) == 256
    assert spelling[ord("a")] == "a" and spelling[ord(" ")] == "Ġ" and spelling[ord("\n")] == "Ċ"


@pytest.mark.slow
def test_ids_equal_transformers_on_sharegpt(tokenizer, hf_gguf_tokenizer, sharegpt_turns):
    texts = sharegpt_turns
    assert len(texts) >= 2000
    assert all(n >= 40 for n in kinds(texts).values()), kinds(texts)
    ours = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    theirs = hf_gguf_tokenizer(texts, add_special_tokens=False)["input_ids"]
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"token ids equal to transformers' GGUF tokenizer on {same}/{len(texts)} ShareGPT turns {kinds(texts)}")
    assert same == len(texts)
    # With add_special_tokens (the default) neither adds a BOS: the file says add_bos_token = False.
    assert tokenizer.encode(texts[0]) == hf_gguf_tokenizer(texts[0])["input_ids"] == ours[0]


@pytest.mark.slow
def test_decode_round_trips(tokenizer, sharegpt_turns):
    texts = sharegpt_turns
    back = sum(tokenizer.decode(tokenizer.encode(t, add_special_tokens=False)) == t for t in texts)
    assert back == len(texts)


def test_special_tokens_stay_whole_and_chat_template_renders(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids) == "user\nhi"  # special tokens are skipped when decoding
    text = tokenizer.chat_template.render([{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
