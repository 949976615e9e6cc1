"""Tiny models and prompts for tests (imported by tests; fixtures live in conftest.py)."""

from __future__ import annotations

import pytest
import torch


def make_hf_model(kind: str, tie: bool = False):
    """A tiny random Qwen3 or Llama with weights large enough that every part of it matters.

    Default init (std 0.02) makes a random model repeat one token, which would prove nothing:
    use std 0.5 and random norm weights.
    """
    transformers = pytest.importorskip("transformers")
    common = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.5,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(0)
    if kind == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=16, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(head_dim=16, **common)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def random_prompts(n: int, seed: int, min_len: int = 1, max_len: int = 40, vocab: int = 97) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (m,), generator=g).tolist() for m in lengths]
