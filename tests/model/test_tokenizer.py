"""Tokenizers: the embedded byte tokenizer, and ``tokenizer.json`` files encoding like transformers
(special tokens added as the file's post-processor says, e.g. Llama's BOS)."""

from __future__ import annotations

import shutil
import sys

import pytest

from minipaged.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

tokenizers = pytest.importorskip("tokenizers")

WORDS = [f"w{i}" for i in range(90)]
BOS, EOS = 1, 2


def write_tokenizer_json(folder, bos: bool) -> None:
    """A word-level ``tokenizer.json``: [UNK]=0, <s>=1, </s>=2, w0..w89 = 3..92; with ``bos`` its
    post-processor puts <s> before every text, as Llama's does."""
    vocab = {"[UNK]": 0, "<s>": BOS, "</s>": EOS, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.add_special_tokens(["<s>", "</s>"])
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    if bos:
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS)]
        )
    tok.save(str(folder / "tokenizer.json"))


TEXTS = ["w5 w17 w3", "w0", "", "w89 w1 w1 nope w2", "<s> w4"]


@pytest.mark.parametrize("bos", [True, False], ids=["bos-post-processor", "no-post-processor"])
def test_encode_adds_special_tokens_like_transformers(tmp_path, bos):
    transformers = pytest.importorskip("transformers")
    write_tokenizer_json(tmp_path, bos)
    ours = load_tokenizer(tmp_path, eos_token_id=EOS)
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    for text in TEXTS:
        assert ours.encode(text) == theirs(text)["input_ids"] == theirs.encode(text)  # add_special_tokens=True
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
    assert ours.encode("w5 w17")[:1] == ([BOS] if bos else [8])
    assert ours.decode(ours.encode("w5 w17")) == "w5 w17"  # the BOS is a special token: not shown


def test_byte_tokenizer_adds_nothing():
    tok = ByteTokenizer(["<copy>", "<end>", "<eos>", "<pad>"], "<eos>")
    assert tok.encode("ab<copy>") == tok.encode("ab<copy>", add_special_tokens=False) == [97, 98, 256]


def test_folder_without_tokenizer_gives_none(tmp_path):
    assert load_tokenizer(tmp_path, eos_token_id=None) is None


def test_missing_tokenizers_package_is_reported_not_hidden(tmp_path, monkeypatch):
    """A tokenizer.json with no ``tokenizers`` installed is an ImportError that says what to install."""
    write_tokenizer_json(tmp_path, bos=True)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # what an uninstalled package looks like to import
    with pytest.raises(ImportError, match="pip install tokenizers"):
        load_tokenizer(tmp_path, eos_token_id=EOS)
    with pytest.raises(ImportError, match="tokenizer.json"):
        HFTokenizer(tmp_path / "tokenizer.json", EOS)


def test_text_prompts_get_the_bos_through_the_engine(tiny_model_dir, tmp_path):
    """A folder's ``tokenizer.json`` serves text prompts: BOS added, text in, text out."""
    from minipaged import LLM, SamplingParams

    folder = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    write_tokenizer_json(folder, bos=True)
    llm = LLM(folder, max_model_len=64)
    out = llm.generate("w5 w17 w3", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)[0]
    assert out.prompt_token_ids == [BOS, 8, 20, 6]
    assert len(out.outputs[0].token_ids) == 4
    assert out.outputs[0].text == load_tokenizer(folder, EOS).decode(out.outputs[0].token_ids)
