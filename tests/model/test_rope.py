"""RoPE frequencies of every supported variant against transformers' own ``ROPE_INIT_FUNCTIONS``
(whole-model parity for each variant is in test_model_parity.py)."""

from __future__ import annotations

import math

import pytest
import torch

from minipaged.model.config import ModelConfig
from minipaged.model.decoder import RotaryEmbedding
from minipaged.model.rope import inverse_frequencies

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
VARIANTS = {
    "linear": dict(rope_type="linear", factor=3.0),
    "llama3": dict(LLAMA3, original_max_position_embeddings=64),
    "llama3-defaults-to-max-len": LLAMA3,
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=512),
    "yarn-no-truncate-betas": dict(
        rope_type="yarn", factor=8.0, original_max_position_embeddings=256, truncate=False, beta_fast=16, beta_slow=2
    ),
    "yarn-mscale": dict(
        rope_type="yarn", factor=16.0, original_max_position_embeddings=256, mscale=0.7, mscale_all_dim=1.0
    ),
    "yarn-attention-factor": dict(
        rope_type="yarn", factor=2.0, original_max_position_embeddings=1024, attention_factor=1.3
    ),
    "yarn-inferred-factor": dict(rope_type="yarn", factor=None, original_max_position_embeddings=1024),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("head_dim", [16, 128])
def test_frequencies_match_transformers(variant, head_dim):
    hf = transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_parameters={**VARIANTS[variant], "rope_theta": 50000.0},
    )
    ref_inv_freq, ref_scaling = ROPE_INIT_FUNCTIONS[VARIANTS[variant]["rope_type"]](hf)
    ours = ModelConfig.from_dict(hf.to_dict())
    inv_freq, scaling = inverse_frequencies(ours.head_dim, ours.rope_theta, ours.rope_scaling)
    torch.testing.assert_close(inv_freq, ref_inv_freq, rtol=1e-6, atol=0)
    assert scaling == pytest.approx(ref_scaling, rel=1e-12)
    plain, _ = inverse_frequencies(head_dim, 50000.0)
    assert not torch.equal(inv_freq, plain) or scaling != 1.0  # every variant changes something


def test_rotary_keeps_norms_and_relative_angles():
    """A rotation: norms stay, and q.k depends only on the distance between positions."""
    rot = RotaryEmbedding(head_dim=8, theta=100.0)
    q, k = torch.randn(1, 1, 8).expand(6, 1, 8), torch.randn(1, 1, 8).expand(6, 1, 8)
    pos = torch.arange(6)
    rq, rk = rot(q, pos), rot(k, pos + 3)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    dots = (rq * rk).sum(-1)
    torch.testing.assert_close(dots, dots[:1].expand(6, 1))


def test_frequencies_are_real_even_when_the_model_is_built_on_meta():
    with torch.device("meta"):
        rot = RotaryEmbedding(16, 1e4, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    assert not rot.inv_freq.is_meta


def test_cos_and_sin_are_rounded_once_from_exact_values():
    """Every cos/sin of a step is the fp32 rounding of the exact value of its fp32 angle (checked
    against Python's math, in double), whatever the process did before: torch's CPU cos/sin could
    not promise that (see ``RotaryEmbedding.cos_sin``)."""
    rot = RotaryEmbedding(head_dim=32, theta=1e4)
    positions = torch.arange(1024)
    cos, sin = rot.cos_sin(positions, torch.float32)  # [positions, 1, head_dim], halves repeated
    angles = (positions.float()[:, None] * rot.inv_freq[None, :]).tolist()
    exact_cos = torch.tensor([[math.cos(a) for a in row] for row in angles], dtype=torch.float64).float()
    exact_sin = torch.tensor([[math.sin(a) for a in row] for row in angles], dtype=torch.float64).float()
    assert torch.equal(cos[:, 0, :16], exact_cos) and torch.equal(cos[:, 0, 16:], exact_cos)
    assert torch.equal(sin[:, 0, :16], exact_sin) and torch.equal(sin[:, 0, 16:], exact_sin)
