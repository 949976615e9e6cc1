"""The decoder and its checkpoint loader against Hugging Face transformers (stage 0's oracle)."""

from __future__ import annotations

import json

import pytest
import torch
from modelkit import make_hf_model, random_prompts

from minipaged.attention.cache_attention import RecomputeAttention
from minipaged.engine.static_generate import greedy_generate
from minipaged.model import load_model


def logits(model, prompt: list[int]) -> torch.Tensor:
    """Our decoder's logits for one prompt: [len(prompt), vocab]."""
    return model(torch.tensor(prompt), torch.arange(len(prompt)), RecomputeAttention(torch.tensor([0, len(prompt)])))


def hf_logits(hf, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0]


@pytest.mark.slow
def test_logits_match_transformers(hf_checkpoint, prompts):
    hf, folder = hf_checkpoint
    model, _ = load_model(folder)
    for p in prompts:
        torch.testing.assert_close(logits(model, p), hf_logits(hf, p), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_packed_batch_logits_match_one_by_one(hf_checkpoint, prompts):
    """Packing sequences of different lengths into one forward changes nothing."""
    _, folder = hf_checkpoint
    model, _ = load_model(folder)
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.tensor([i for p in prompts for i in range(len(p))])
    cu = torch.tensor([0, *[len(p) for p in prompts]]).cumsum(0)
    packed = model(ids, positions, RecomputeAttention(cu))
    for i, p in enumerate(prompts):
        alone = model(torch.tensor(p), torch.arange(len(p)), RecomputeAttention(torch.tensor([0, len(p)])))
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
@pytest.mark.slow
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
    torch.testing.assert_close(logits(model, prompts[1]), hf_logits(hf, prompts[1]), rtol=1e-5, atol=1e-5)


def rope(rope_type: str, **params) -> dict:
    return {"rope_parameters": {"rope_type": rope_type, "rope_theta": 10000.0, **params}}


# Every supported config value that changes the maths, one tiny model each: (model_type, config fields,
# whether dropping the fields from config.json must change our logits, i.e. the field is really read).
VARIANTS = {
    "llama-gelu": ("llama", dict(hidden_act="gelu"), True),
    "llama-gelu-tanh": ("llama", dict(hidden_act="gelu_pytorch_tanh"), True),
    "llama-gelu-new": ("llama", dict(hidden_act="gelu_new"), True),
    "llama-relu": ("llama", dict(hidden_act="relu"), True),
    "qwen3-swish": ("qwen3", dict(hidden_act="swish"), False),  # another name for silu
    "llama-biases": ("llama", dict(attention_bias=True, mlp_bias=True), False),
    "qwen3-attention-bias": ("qwen3", dict(attention_bias=True), False),
    "qwen2-qkv-bias": ("qwen2", {}, False),
    "mistral-no-window": ("mistral", dict(sliding_window=None), False),
    "mistral-window-covers-max-len": ("mistral", dict(sliding_window=256), False),
    "qwen3-window-covers-max-len": (
        "qwen3",
        dict(use_sliding_window=True, sliding_window=300, max_window_layers=1),
        False,
    ),
    "llama-head-dim-not-hidden-over-heads": ("llama", dict(head_dim=24), False),
    "llama-eps": ("llama", dict(rms_norm_eps=0.5), True),
    "llama-theta": ("llama", rope("default", rope_theta=500.0), True),
    "llama-rope-linear": ("llama", rope("linear", factor=4.0), True),
    "llama-rope-llama3": (
        "llama",
        rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32),
        True,
    ),
    "qwen3-rope-yarn": ("qwen3", rope("yarn", factor=4.0, original_max_position_embeddings=64), True),
    "qwen2-rope-yarn-mscale": (
        "qwen2",
        rope("yarn", factor=4.0, original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=0.5, beta_fast=16),
        True,
    ),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_supported_config_variants_match_transformers(variant, tmp_path, prompts):
    kind, fields, read = VARIANTS[variant]
    hf = make_hf_model(kind, **fields)
    hf.save_pretrained(tmp_path / "ckpt")
    model, _ = load_model(tmp_path / "ckpt")
    ours = [logits(model, p) for p in prompts]
    # RoPE's cos/sin are rounded once from float64 here, transformers' fp32 ones are within an ulp of
    # that: these deliberately sharp random models turn the difference into up to ~3e-5 of logits.
    for p, got in zip(prompts, ours):
        torch.testing.assert_close(got, hf_logits(hf, p), rtol=1e-5, atol=1e-4)
    if read:  # the same weights with the field left out compute something else: we do read it
        cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
        (tmp_path / "ckpt" / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k not in fields}))
        plain, _ = load_model(tmp_path / "ckpt")
        assert not torch.allclose(logits(plain, prompts[0]), ours[0], atol=1e-3)


# Issue 11's cases that loaded silently and generated other tokens than transformers:
# a window narrower than the model's context is refused at load time (with the field named).
REFUSED = {
    "mistral-sliding-window": ("mistral", dict(sliding_window=16), "sliding_window=16"),
    "qwen3-use-sliding-window": (
        "qwen3",
        dict(use_sliding_window=True, sliding_window=16, max_window_layers=1),
        "use_sliding_window=True with sliding_window=16",
    ),
}


@pytest.mark.parametrize("variant", REFUSED)
def test_sliding_window_narrower_than_context_is_refused(variant, tmp_path):
    kind, fields, message = REFUSED[variant]
    hf = make_hf_model(kind, **fields)
    hf.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_model(tmp_path)
    # Refusing is not over-cautious: past the window, transformers' logits differ from full attention's.
    cfg = json.loads((tmp_path / "config.json").read_text())
    no_window = {"sliding_window": None, "use_sliding_window": False, "layer_types": None}
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **no_window}))
    full, _ = load_model(tmp_path)
    prompt = random_prompts(1, seed=3, min_len=40, max_len=40)[0]
    assert not torch.allclose(logits(full, prompt)[-1], hf_logits(hf, prompt)[-1], atol=1e-3)
