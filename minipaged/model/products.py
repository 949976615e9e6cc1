"""The weight products of a decoder, ``y = x W^T + b``, in the number format the CPU multiplies fastest.

Almost all of a decode step's arithmetic is these products: per layer Q/K/V (fused), the
attention output, gate/up (fused) and down, then the LM head. At one row each is a
matrix-vector product, so a step cannot beat the time it takes to read every weight once;
at 32 rows it is a skinny matrix product, where the arithmetic starts to count.

Two ways to run a product:

- :class:`Product`: ``F.linear`` in the weight's own dtype (fp32 by default). Exact to
  transformers' fp32 forward: every parity test uses it.
- :class:`PackedProduct`: the weight rounded to bfloat16 once and laid out once for
  oneDNN's inner-product kernel (``torch.ops.mkldnn._reorder_linear_weight``, what torch's own
  CPU freezing does), then ``torch.ops.mkldnn._linear_pointwise`` per call. The input is rounded
  to bf16, the products accumulate in fp32 inside the kernel, and the result comes back in the
  input's dtype. Half the bytes to read, and CPUs with AVX512-BF16 or AMX multiply bf16 pairs in
  hardware. Measured on one core of an AVX512-BF16 CPU, the fused gate/up weight of SmolLM2
  (3,072 x 576): fp32 ``F.linear`` 0.093 ms at 1 row and 1.66 ms at 32 rows; bf16 ``F.linear``
  0.10 / 0.46 ms; prepacked bf16 0.053 / 0.34 ms, with results identical to bf16 ``F.linear``.

Which one a model uses is decided once, when the engine loads it
(:mod:`minipaged.model.precision`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Product:
    """``x: [rows, in_features] -> [rows, out_features]``, ``F.linear`` with ``weight: [out, in]``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedProduct(Product):
    """The same product with the weight in ``dtype`` (bf16 by default), prepacked for oneDNN; the
    output in ``x``'s dtype.

    The packed weight is an opaque oneDNN tensor that only this kernel reads; ``weight`` keeps
    the original (fp32) matrix, so the model's state dict and its tied embedding are unchanged.
    Packed in fp32 (the LM head under ``dtype="auto"``), the product keeps fp32 precision and
    still runs faster than ``F.linear``: SmolLM2's 49,152 x 576 head took 2.2 ms against 6.9 ms at
    1 row and 5.2 against 19.1 ms at 32 rows here (results within 3e-6 of ``F.linear``'s).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16):
        super().__init__(weight, bias)
        self.dtype = dtype
        # oneDNN's CPU ops are private to torch: the same ones torch's own CPU freezing calls.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype))  # noqa: SLF001
        self.packed_bias = None if bias is None else bias.detach().to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:  # oneDNN has no empty inner product
            return x.new_empty(0, self.out_features)
        xd = x.to(self.dtype)
        y = torch.ops.mkldnn._linear_pointwise(xd, self.packed, self.packed_bias, "none", [], "")  # noqa: SLF001
        return y.to(x.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weight a product reads."""
        return self.weight.numel() * torch.empty((), dtype=self.dtype).element_size()


def packed_bf16_available() -> bool:
    """Whether this torch build has oneDNN's CPU inner product (x86 builds do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
