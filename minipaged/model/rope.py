"""Rotary position embeddings (RoPE): the one place their frequencies are computed (the decoder's
:class:`~minipaged.model.decoder.RotaryEmbedding` applies them, as transformers keeps its RoPE
variants in ``modeling_rope_utils`` beside each model's rotary module).

RoPE turns position into rotation. In the "rotate half" layout of Hugging Face checkpoints,
dimensions ``i`` and ``i + head_dim/2`` of a query or key form a pair that is rotated by the
angle ``position * inv_freq[i]``. The dot product of a rotated query and key then depends only
on how far apart they are, which is why cached keys never need rotating again.

``inv_freq[i] = 1 / theta ** (2i / head_dim)`` is plain RoPE. The variants that stretch a model
to longer contexts change only these frequencies (and, for YaRN, scale cos/sin by a constant),
so they are a few lines each here:

- ``linear``: every frequency divided by ``factor`` (positions interpolated);
- ``llama3``: low frequencies divided by ``factor``, high ones kept, a smooth blend between;
- ``yarn``: the same idea with a linear ramp over dimensions, plus an attention scaling.

Variants whose frequencies change with the sequence length (``dynamic``, ``longrope``) are
refused by :mod:`minipaged.model.config`.
"""

from __future__ import annotations

import math

import torch


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None = None) -> tuple[torch.Tensor, float]:
    """-> (inv_freq: fp32 [head_dim // 2] on the CPU, attention_scaling applied to cos and sin).

    ``scaling`` is ``ModelConfig.rope_scaling``: None for plain RoPE, else a dict with ``rope_type``.
    The formulas follow transformers' ``modeling_rope_utils`` so that logits match to 1e-5.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
    inv_freq = 1.0 / theta**exponents
    if scaling is None or scaling["rope_type"] == "default":
        return inv_freq, 1.0
    kind = scaling["rope_type"]
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    if kind == "yarn":
        return _yarn(theta**exponents, head_dim, theta, scaling)
    raise ValueError(f"rope_type {kind!r} is not implemented")


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: wavelengths longer than ``original / low_freq_factor`` are stretched by ``factor``,
    those shorter than ``original / high_freq_factor`` kept, the band between blended smoothly."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    original = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def _yarn(pos_freqs: torch.Tensor, head_dim: int, theta: float, s: dict) -> tuple[torch.Tensor, float]:
    """YaRN: dimensions that turn many times over the original context keep their frequency
    (extrapolation), slow ones are divided by ``factor`` (interpolation), with a linear ramp between."""
    factor, original = s["factor"], s["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_scaling = s.get("attention_factor")
    if attention_scaling is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention_scaling = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def dim_for(rotations: float) -> float:
        """The dimension whose pair turns ``rotations`` times over the original context."""
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_for(s.get("beta_fast") or 32), dim_for(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # avoid dividing by zero in the ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # 1 keeps the original frequency, 0 interpolates fully
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_scaling)
