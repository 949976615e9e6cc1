"""Which number format each part of a step computes in: ``LLM(dtype=...)``.

- ``"float32"``: everything in fp32. Exact to transformers' fp32 forward, so every test and
  notebook that asserts equality names it.
- ``"bfloat16"`` / ``"float16"``: weights, activations and the KV cache all in that dtype (what
  a GPU runs).
- ``"auto"``: on a CPU that multiplies bf16 in hardware (the ``avx512_bf16`` or ``amx_bf16``
  flag: Intel Xeon since Sapphire Rapids, AMD since Zen 4), the weight products run in bf16
  (:class:`~minipaged.model.products.PackedProduct`) and the KV cache holds bf16: half the
  bytes to read per step, and twice the blocks in the same memory. What a small model's answers
  are sensitive to stays fp32: the residual stream, RMSNorm, the RoPE angles, attention's scores
  and softmax, the LM head (so the logits) and sampling. On a
  CPU without bf16 arithmetic, on a GPU (whose kernels take one dtype for q and the cache), and
  for a model under :data:`AUTO_BF16_MIN_BYTES` of fp32 weights (the embedded copy model, the
  tests' random models: a step of theirs is fixed costs, not weight reads, so bf16 would buy
  nothing and they stay exact), ``"auto"`` is fp32.

Measured with transformers on 120 real ShareGPT texts: perplexity fp32 38.94, bf16 weights with
an fp32 residual stream 38.96, everything bf16 39.05. Measured here on SmolLM2-135M-Instruct:
perplexity on 24 ShareGPT texts 11.731 (fp32) and 11.734 (auto); the first greedy token of 128
real chats equal to fp32's on 127 (6 differed while the LM head was bf16 too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from minipaged.model.products import packed_bf16_available

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTO_BF16_MIN_BYTES = 100 * 10**6  # fp32 weight bytes from which "auto" multiplies in bf16


@dataclass(frozen=True)
class Precision:
    """``weights``: the dtype the model is loaded in (its residual stream computes in it too);
    ``bf16_products``: whether the weight products run in packed bf16; ``kv_cache``: the cache's
    dtype; ``reason``: why, in words (logged at load)."""

    weights: torch.dtype
    bf16_products: bool
    kv_cache: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        if self.bf16_products:
            return "auto (bf16 products and KV cache, fp32 elsewhere)"
        return str(self.weights).removeprefix("torch.")


def cpu_bf16_flags() -> list[str]:
    """The CPU flags that say it multiplies bf16 in hardware (empty when it does not)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: ask torch (private helpers, absent from some builds)
        found = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        return ["avx512_bf16"] if found else []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in ("amx_bf16", "avx512_bf16") if f in flags]


def load_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The dtype to load the weights in for ``dtype`` (``"auto"`` loads fp32, then decides)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto', one of {sorted(DTYPES)} or a torch dtype, got {dtype!r}")
    return DTYPES[dtype]


def resolve_precision(dtype: str | torch.dtype, device: torch.device, weight_bytes: int) -> Precision:
    """``dtype`` as ``LLM`` takes it (``"auto"``, a name of :data:`DTYPES` or a torch dtype), for a
    model of ``weight_bytes`` loaded in :func:`load_dtype`'s dtype."""
    weights = load_dtype(dtype)
    if dtype != "auto":
        return Precision(weights, False, weights, f"dtype={dtype!r} was asked for")
    fp32 = "dtype='auto' gives float32: "
    if device.type != "cpu":
        return Precision(weights, False, weights, fp32 + f"on {device.type} every kernel takes one dtype")
    if weight_bytes < AUTO_BF16_MIN_BYTES:
        why = f"a model of {weight_bytes / 1e6:.0f} MB spends a step on fixed costs, not on reading weights"
        return Precision(weights, False, weights, fp32 + why)
    flags = cpu_bf16_flags()
    if not flags:
        return Precision(weights, False, weights, fp32 + "this CPU has no bf16 arithmetic")
    if not packed_bf16_available():
        return Precision(weights, False, weights, fp32 + "this torch build has no oneDNN")
    why = f"dtype='auto': this CPU multiplies bf16 in hardware ({', '.join(flags)}), so the weight products and "
    return Precision(weights, True, torch.bfloat16, why + "the KV cache are bf16, the rest float32")
