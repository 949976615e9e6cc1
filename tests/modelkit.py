"""Tiny models and prompts for tests (imported by tests; fixtures live in conftest.py)."""

from __future__ import annotations

import pytest
import torch

# model_type -> the transformers class-name prefix (``Qwen3Config``, ``Qwen3ForCausalLM``)
HF_CLASSES = {"qwen3": "Qwen3", "llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}


def make_hf_model(kind: str, tie: bool = False, **overrides):
    """A tiny random model of one family (``kind`` a model_type) with weights large enough that
    every part of it matters; ``overrides`` are config fields (``hidden_act="gelu"``, ...).

    Default init (std 0.02) makes a random model repeat one token, which would prove nothing:
    use std 0.5, and random norm weights and biases (transformers starts them at 1 and 0).
    The model runs transformers' eager attention, whose sums come in the same order as minipaged's
    reference attention: logits then agree to the last bit, where SDPA differs by ~2e-5 here.
    """
    transformers = pytest.importorskip("transformers")
    fields = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        initializer_range=0.5,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
    )
    fields.update(overrides)
    prefix = HF_CLASSES[kind]
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{prefix}Config")(**fields)
    model = getattr(transformers, f"{prefix}ForCausalLM")(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.5)
    model.set_attn_implementation("eager")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def random_prompts(n: int, seed: int, min_len: int = 1, max_len: int = 40, vocab: int = 97) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (m,), generator=g).tolist() for m in lengths]
