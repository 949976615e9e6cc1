"""Attention backends: three implementations of the same three paged operations.

Each backend is a module with ``store_kvcache``, ``paged_prefill_attention`` and
``paged_decode_attention`` (same names, shapes and semantics), so the caches can swap them:

- ``"reference"``: :mod:`minipaged.attention.reference`, the per-sequence oracle (slow, readable);
- ``"torch"``: :mod:`minipaged.attention.batched`, the whole batch in a few tensor ops;
- ``"triton"``: :mod:`minipaged.kernels` (compiled on a GPU, Triton's interpreter on a CPU);
- ``"auto"``: Triton on a CUDA device, the batched torch path elsewhere.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

BACKENDS = ("reference", "torch", "triton", "auto")
_MODULES = {
    "reference": "minipaged.attention.reference",
    "torch": "minipaged.attention.batched",
    "triton": "minipaged.kernels",
}


def resolve_backend(name: str, device: torch.device | str = "cpu") -> str:
    """The backend ``name`` stands for on ``device`` (``"auto"`` decided here)."""
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return name


def get_ops(name: str, device: torch.device | str = "cpu") -> ModuleType:
    """The module holding backend ``name``'s three operations (Triton is imported only if chosen)."""
    return importlib.import_module(_MODULES[resolve_backend(name, device)])
