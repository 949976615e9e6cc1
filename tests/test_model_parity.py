"""The decoder and its checkpoint loader against Hugging Face transformers (stage 0's oracle)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from minipaged.attention.backend import RecomputeBackend
from minipaged.generate import greedy_generate
from minipaged.model import load_model


def test_logits_match_transformers(hf_checkpoint, prompts):
    hf, folder = hf_checkpoint
    model, _ = load_model(folder)
    for p in prompts:
        ids = torch.tensor(p)
        with torch.no_grad():
            ref = hf(ids[None]).logits[0]
        ours = model(ids, torch.arange(len(p)), RecomputeBackend(torch.tensor([0, len(p)])))
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_packed_batch_logits_match_one_by_one(hf_checkpoint, prompts):
    """Packing sequences of different lengths into one forward changes nothing."""
    _, folder = hf_checkpoint
    model, _ = load_model(folder)
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.tensor([i for p in prompts for i in range(len(p))])
    cu = torch.tensor([0, *[len(p) for p in prompts]]).cumsum(0)
    packed = model(ids, positions, RecomputeBackend(cu))
    for i, p in enumerate(prompts):
        alone = model(torch.tensor(p), torch.arange(len(p)), RecomputeBackend(torch.tensor([0, len(p)])))
        torch.testing.assert_close(packed[cu[i] : cu[i + 1]], alone, rtol=1e-5, atol=1e-5)


NEW_TOKENS = 32


@pytest.fixture(scope="session")
def hf_greedy(hf_checkpoint, prompts):
    """transformers' own greedy ``generate`` for every prompt (computed once per model family)."""
    hf, _ = hf_checkpoint
    with torch.no_grad():
        return [
            hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]


@pytest.mark.parametrize("cache", ["recompute", "contiguous", "paged"])
def test_greedy_tokens_match_transformers_generate(hf_checkpoint, hf_greedy, prompts, cache):
    _, folder = hf_checkpoint
    model, _ = load_model(folder)
    ours = greedy_generate(model, prompts, NEW_TOKENS, cache=cache, block_size=8).tokens
    assert ours == hf_greedy
    assert len(set(map(tuple, ours))) == len(prompts)  # a random model that repeats one token proves nothing


def test_sharded_checkpoint_loads(hf_checkpoint, tmp_path, prompts):
    hf, _ = hf_checkpoint
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    model, _ = load_model(tmp_path)
    p = torch.tensor(prompts[1])
    with torch.no_grad():
        ref = hf(p[None]).logits[0]
    torch.testing.assert_close(
        model(p, torch.arange(len(p)), RecomputeBackend(torch.tensor([0, len(p)]))), ref, rtol=1e-5, atol=1e-5
    )


def test_clear_errors(hf_checkpoint, tmp_path):
    _, folder = hf_checkpoint
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        load_model(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "hidden_size": 32}))
    with pytest.raises(ValueError, match="shape"):
        load_model(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="lacks"):
        load_model(bad)


def test_tokenizer_json_serves_text_prompts(hf_checkpoint, tmp_path):
    """A folder's ``tokenizer.json`` is read with the ``tokenizers`` package: text in, text out."""
    tokenizers = pytest.importorskip("tokenizers")
    hf, _ = hf_checkpoint
    hf.save_pretrained(tmp_path)
    words = [f"w{i}" for i in range(96)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}},
                                                           unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    tok.save(str(tmp_path / "tokenizer.json"))
    from minipaged import LLM, SamplingParams

    llm = LLM(tmp_path, max_model_len=64)
    out = llm.generate("w5 w17 w3", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)[0]
    assert out.prompt_token_ids == [6, 18, 4]
    assert out.outputs[0].text == tok.decode(out.outputs[0].token_ids)
    assert len(out.outputs[0].token_ids) == 4
