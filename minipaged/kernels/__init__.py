"""Stage 4: Triton kernels for the paged KV cache (store, prefill attention, decode attention).

Same names, shapes and semantics as the torch path (:mod:`minipaged.attention.reference`), so
:class:`TritonBackend` stands in for the torch backends behind one interface
(:mod:`minipaged.attention.backends`). Each module reads like a
Triton tutorial: the kernel, then a short wrapper that checks its arguments
(:mod:`~minipaged.kernels._checks`), picks tile sizes and launches.

- :mod:`~minipaged.kernels.paged_attention`: one kernel for prefill and decode;
- :mod:`~minipaged.kernels.store`: ``store_kvcache``, new K/V into their slots;
- :mod:`~minipaged.kernels.backend`: :class:`TritonBackend`, which launch each step takes;
- :mod:`~minipaged.kernels.interpreter`: where a launch runs. Tensors on a CUDA device run the
  compiled kernels; tensors anywhere else run in Triton's interpreter (slowly — fine for tests
  and notebooks, not for speed), whatever was imported first. :data:`INTERPRET` is the mode on
  this machine's default device, :func:`interpreting` the mode for a given device;
- :mod:`~minipaged.kernels.choose`: ``get_backend(name, device)``, every backend by name.

Only this package imports Triton, and only when one of the names below is first used
(``kernels.paged_prefill_attention``, ``from minipaged.kernels import TritonBackend``): the
engine reaches :mod:`~minipaged.kernels.choose` through this package, and ``import minipaged``
and the torch path must not load Triton on the way.
"""

from __future__ import annotations

import importlib
from typing import Any

# Each exported name and the module it comes from.
_HOMES = {
    "INTERPRET": "interpreter",
    "TritonBackend": "backend",
    "interpreting": "interpreter",
    "kernel_constexprs": "paged_attention",
    "paged_decode_attention": "paged_attention",
    "paged_prefill_attention": "paged_attention",
    "store_constexprs": "store",
    "store_kvcache": "store",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    """``minipaged.kernels.NAME``, imported (Triton with it) the first time it is asked for."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value  # later lookups find it without coming here
    return value
