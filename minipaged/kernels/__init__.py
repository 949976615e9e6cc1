"""Stage 4: Triton kernels for the paged KV cache (store, prefill attention, decode attention).

Same names, shapes and semantics as the torch path (:mod:`minipaged.attention.reference`), so
:class:`TritonBackend` stands in for the torch backends behind one interface
(:mod:`minipaged.attention.backends`). Each module reads like a
Triton tutorial: the kernel, then a short wrapper that checks its arguments
(:mod:`~minipaged.kernels._checks`), picks tile sizes and launches.

- :mod:`~minipaged.kernels.paged_attention`: one kernel for prefill and decode;
- :mod:`~minipaged.kernels.store`: ``store_kvcache``, new K/V into their slots;
- :mod:`~minipaged.kernels.interpreter`: where a launch runs. Tensors on a CUDA device run the
  compiled kernels; tensors anywhere else run in Triton's interpreter (slowly — fine for tests
  and notebooks, not for speed), whatever was imported first. :data:`INTERPRET` is the mode on
  this machine's default device, :func:`interpreting` the mode for a given device.

Only this package imports Triton; ``import minipaged`` and the torch path do not need it.
"""

from minipaged.kernels.backend import TritonBackend
from minipaged.kernels.interpreter import INTERPRET, interpreting
from minipaged.kernels.paged_attention import kernel_constexprs, paged_decode_attention, paged_prefill_attention
from minipaged.kernels.store import store_constexprs, store_kvcache

__all__ = [
    "INTERPRET",
    "TritonBackend",
    "interpreting",
    "kernel_constexprs",
    "paged_decode_attention",
    "paged_prefill_attention",
    "store_constexprs",
    "store_kvcache",
]
