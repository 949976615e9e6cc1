"""Stage 4: Triton kernels for the paged KV cache (store, prefill attention, decode attention).

Same names, shapes and semantics as the torch path (:mod:`minipaged.kv.slot_mapping` and
:mod:`minipaged.attention.reference`), so :func:`minipaged.attention.backend.get_ops` can swap
one for the other.

Triton decides at *decoration* time (``@triton.jit``, i.e. when a kernel module is imported)
whether a kernel runs compiled on a GPU or in its NumPy interpreter. Without CUDA, and unless
the user chose with ``TRITON_INTERPRET``, this package switches the interpreter on before it
imports any kernel module: the kernels then run on CPU tensors (slowly — fine for tests and
notebooks, not for speed). :data:`INTERPRET` says which mode the kernels were built in.

Only this package imports Triton; ``import minipaged`` and the torch path do not need it.
"""

from __future__ import annotations

import os

import torch

_TRUE = ("1", "true", "yes", "on", "y")


def _choose_interpreter() -> bool:
    """Switch Triton's interpreter on where no GPU can run the kernels; return the mode in force."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        try:  # Triton >= 3.4 keeps its settings in `triton.knobs`; older ones read the variable.
            from triton import knobs
        except ImportError:
            knobs = None
        if knobs is not None and hasattr(knobs, "runtime") and hasattr(knobs.runtime, "interpret"):
            knobs.runtime.interpret = True
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


INTERPRET: bool = _choose_interpreter()

from minipaged.kernels.paged_attention import paged_decode_attention, paged_prefill_attention  # noqa: E402
from minipaged.kernels.store_kvcache import store_kvcache  # noqa: E402

__all__ = ["INTERPRET", "paged_decode_attention", "paged_prefill_attention", "store_kvcache"]
