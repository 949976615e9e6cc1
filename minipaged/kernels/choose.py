"""Choosing an attention backend by name: :func:`get_backend`, the one place that builds every kind.

``"reference"`` and ``"torch"`` live below this package (:mod:`minipaged.attention.backends`,
which also says what ``"auto"`` means on a device); ``"triton"`` is this package's
:class:`~minipaged.kernels.backend.TritonBackend`. The engine and the static runner sit above
both and call :func:`get_backend`. Triton is imported only when it is chosen: importing this
module does not load it (the package's own names load lazily, see :mod:`minipaged.kernels`),
so ``import minipaged`` and the torch path never need it.
"""

from __future__ import annotations

import torch

from minipaged.attention.backends import AttentionBackend, resolve_backend
from minipaged.attention.batched import TorchBackend
from minipaged.attention.reference import ReferenceBackend


def get_backend(name: str, device: torch.device | str = "cpu") -> AttentionBackend:
    """An instance of backend ``name`` (one of ``BACKENDS``) for ``device``."""
    chosen = resolve_backend(name, device)
    if chosen == "triton":
        # Here, not at the top: this import loads Triton (pyproject.toml's Triton contract names it).
        from minipaged.kernels.backend import TritonBackend

        return TritonBackend()
    return ReferenceBackend() if chosen == "reference" else TorchBackend()
