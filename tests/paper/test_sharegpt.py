"""ShareGPT: the cut file read record by record, vLLM's sampling and filter, the cache of token lengths.

The small cases write their own ShareGPT-like files; the slow ones read the package index's copy
(fetched once into the download cache) and count it in the real model's tokens (minutes, once:
the counts are cached).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from minipaged.paper import sharegpt
from minipaged.paper.sharegpt import Lengths, ShareGPT


def _record(i: int, turns: list[tuple[str, str]]) -> dict:
    return {"id": f"c{i}", "conversations": [{"from": who, "value": text} for who, text in turns]}


RECORDS = [
    _record(0, [("human", "one two three four five"), ("gpt", "a b c d e f")]),
    _record(1, [("human", "only one turn here")]),
    _record(2, [("gpt", "an answer first"), ("human", "then a question"), ("gpt", "and its answer")]),
    _record(3, [("human", "hi"), ("gpt", "w x y z")]),
]


@pytest.fixture
def cut_file(tmp_path):
    """Four complete records, then a fifth cut in the middle of a string (as the package's copy is)."""
    text = json.dumps(RECORDS + [_record(4, [("human", "this record never ends")])], indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index("never") + 3], encoding="utf-8")
    return path


class WordCounter:
    """A tokenizer for the cache tests: a word (or a character) is a token; counts its calls."""

    def __init__(self, unit: str = "words") -> None:
        self.unit, self.calls = unit, 0

    @property
    def fingerprint(self) -> str:
        return f"{self.unit}-tokenizer"

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        self.calls += 1
        return [[0] * (len(t.split()) if self.unit == "words" else len(t)) for t in texts]


def test_a_cut_file_keeps_its_complete_records_and_says_it_is_cut(cut_file, tmp_path):
    data = ShareGPT.load(cut_file)
    assert data.num_records == 4 and data.truncated
    assert [c.id for c in data.conversations] == ["c0", "c1", "c2", "c3"]
    assert data.conversations[2].turns[0] == sharegpt.Turn("gpt", "an answer first")
    assert "4 conversations" in data.describe() and "cut inside a record" in data.describe()
    # vLLM's candidates: at least two turns, the first two whoever spoke them
    assert data.pairs() == [
        ("one two three four five", "a b c d e f"),
        ("an answer first", "then a question"),
        ("hi", "w x y z"),
    ]
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(RECORDS))
    assert not ShareGPT.load(whole).truncated and ShareGPT.load(whole).num_records == 4


def test_vllms_filter_bounds():
    prompt = np.array([4, 3, 4, 1024, 1025, 1024, 1000])
    output = np.array([4, 4, 3, 1024, 4, 1025, 1048])
    assert sharegpt.is_valid(prompt, output).tolist() == [True, False, False, True, False, False, True]
    assert sharegpt.is_valid(prompt, output, max_total_len=512).tolist() == [True] + [False] * 6
    assert sharegpt.is_valid(prompt, output, skip_min_output=True).tolist()[2]  # --sharegpt-output-len


def _vllm_sample(pairs: list[tuple[int, int]], num_requests: int, seed: int) -> list[tuple[int, int]]:
    """vLLM's ShareGPTDataset steps, written out: the global random module, seeded, then shuffle and walk."""
    data = list(pairs)
    random.seed(seed)
    random.shuffle(data)
    chosen = [(p, o) for p, o in data if p >= 4 and o >= 4 and p <= 1024 and p + o <= 2048][:num_requests]
    random.seed(seed)
    return chosen + [random.choice(chosen) for _ in range(num_requests - len(chosen))]


def test_sampling_follows_vllms_shuffle_filter_and_oversampling():
    rng = np.random.default_rng(0)
    prompt, output = rng.integers(1, 1500, 300).astype(np.int32), rng.integers(1, 1500, 300).astype(np.int32)
    lengths = Lengths(prompt, output, num_records=300, truncated=False)
    pairs = list(zip(prompt.tolist(), output.tolist()))
    for n in (10, 100, 250):  # 250: more than pass the filter, so vLLM repeats some
        for seed in (0, 7):
            ours = [pairs[i] for i in sharegpt.sample_indices(lengths, n, seed)]
            assert ours == _vllm_sample(pairs, n, seed)
    assert sharegpt.sample_indices(lengths, 50, 1) == sharegpt.sample_indices(lengths, 50, 1)
    assert sharegpt.sample_indices(lengths, 50, 1) != sharegpt.sample_indices(lengths, 50, 2)
    passing = int(sharegpt.is_valid(prompt, output).sum())
    assert len(set(sharegpt.sample_indices(lengths, 250, 0))) == passing < 250
    with pytest.raises(ValueError, match="at least 1"):
        sharegpt.sample_indices(lengths, 0)
    with pytest.raises(ValueError, match="no ShareGPT conversation passes"):
        sharegpt.sample_indices(lengths, 5, max_prompt_len=0)


def test_token_lengths_are_cached_and_a_new_tokenizer_counts_again(cut_file, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path / "cache"))
    words = WordCounter()
    first = sharegpt.token_lengths(words, cut_file)
    assert first.prompt.tolist() == [5, 3, 1] and first.output.tolist() == [6, 3, 4]
    assert first.num_records == 4 and first.truncated and words.calls == 1
    again = WordCounter()
    second = sharegpt.token_lengths(again, cut_file)
    assert again.calls == 0 and second.prompt.tolist() == [5, 3, 1] and second.truncated  # read from the cache
    chars = WordCounter("chars")
    assert sharegpt.token_lengths(chars, cut_file).prompt.tolist() == [23, 15, 2] and chars.calls == 1
    assert len(list((tmp_path / "cache" / "sharegpt").glob("lengths-*.npz"))) == 2
    cut_file.write_text(cut_file.read_text().replace('"hi"', '"hi there"'))  # another file: counted again
    other = WordCounter()
    assert sharegpt.token_lengths(other, cut_file).prompt.tolist() == [5, 3, 2] and other.calls == 1


def test_sample_requests_send_the_first_turn_with_the_second_turns_length(cut_file, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path / "cache"))
    requests = sharegpt.sample_requests(2, seed=0, tokenizer=WordCounter("chars"), path=cut_file)
    assert sorted((r.prompt, r.prompt_len, r.output_len) for r in requests) == [
        ("an answer first", 15, 15),
        ("one two three four five", 23, 11),
    ]  # "hi" (2 characters) is under vLLM's 4-token minimum
    fixed = sharegpt.sample_requests(2, seed=0, tokenizer=WordCounter("chars"), path=cut_file, output_len=3)
    assert [r.output_len for r in fixed] == [3, 3]


# -- the package index's file, in the real model's tokens ------------------------------------------
@pytest.fixture(scope="module")
def real_file():
    return ShareGPT.load()


@pytest.mark.slow  # parses 126 MB
def test_the_package_index_copy_has_17671_complete_conversations(real_file):
    assert real_file.num_records == 17_671 and real_file.truncated
    assert real_file.file_bytes == 125_509_632
    assert len(real_file.pairs()) == 17_400  # 271 have a single turn
    first = real_file.conversations[0]
    assert first.id == "QWJhYvA_0" and [t.role for t in first.turns[:2]] == ["human", "gpt"]


@pytest.mark.slow  # tokenizes 35k texts the first time (minutes), then reads the cache
def test_real_lengths_in_the_models_tokens(real_file):
    tokenizer = sharegpt.sharegpt_tokenizer()
    lengths = sharegpt.token_lengths(tokenizer)
    assert len(lengths.prompt) == 17_400 and lengths.num_records == 17_671 and lengths.truncated
    pairs = real_file.pairs()
    for i in (0, 1, 5000):
        assert lengths.prompt[i] == len(tokenizer.encode(pairs[i][0]))
        assert lengths.output[i] == len(tokenizer.encode(pairs[i][1]))
    assert int(sharegpt.is_valid(lengths.prompt, lengths.output).sum()) == 15_417
    trace = sharegpt.real_trace(1000, seed=0)
    assert len(trace) == 1000 and trace == sharegpt.real_trace(1000, seed=0)
    assert all(4 <= r.prompt_len <= 1024 and r.output_len >= 4 and r.total_len <= 2048 for r in trace)
    assert sum(r.prompt_len for r in trace) / 1000 == pytest.approx(245.572)
    assert sum(r.output_len for r in trace) / 1000 == pytest.approx(204.405)
    assert all(r.total_len <= 512 for r in sharegpt.real_trace(50, seed=0, max_len=512))


@pytest.mark.slow  # parses 126 MB
def test_each_turns_prompt_starts_with_the_turns_before_it(real_file):
    template = sharegpt.sharegpt_tokenizer().chat_template
    assert template is not None
    chat = next(c for c in real_file.conversations if len(c.turns) >= 6 and c.turns[0].role == "gpt")
    turns = sharegpt.chat_turns(chat, template)
    assert len(turns) >= 2 and chat.turns[0].text not in turns[0][0]  # the leading answer has no question
    for (prompt, answer), (following, _) in zip(turns, turns[1:]):
        assert following.startswith(prompt + answer) and len(following) > len(prompt + answer)
    assert turns[0][0].endswith("<|im_start|>assistant\n")
