"""Attention backends: one small interface, three implementations of paged attention.

Every layer of a paged cache does the same two things each step: write the new tokens' K/V
(``store_kvcache``), then ``attend`` through the block tables, whatever mix of prompts, chunks
and single decode tokens the step brings. Before the first layer, ``plan`` turns the step's
:class:`~minipaged.attention.metadata.PagedMetadata` into whatever the backend wants to compute
once per step rather than once per layer (and a backend with a faster path for some steps, as
Triton's decode kernel for steps of one token per sequence, decides there which one the step
takes). :class:`AttentionBackend` is that interface:

- ``"reference"``: :class:`~minipaged.attention.reference.ReferenceBackend`, the per-sequence
  oracle every other backend is tested against (slow, readable);
- ``"torch"``: :class:`~minipaged.attention.batched.TorchBackend`, the whole batch in a few
  tensor ops, the CPU default;
- ``"triton"``: ``minipaged.kernels.TritonBackend`` (compiled on a GPU, Triton's interpreter on
  a CPU);
- ``"auto"``: Triton on a CUDA device, torch elsewhere (:func:`resolve_backend`).

Each backend lives beside the functions it calls (as vLLM keeps one backend a file); this
module holds the interface they share. Building the chosen one is
:func:`minipaged.kernels.choose.get_backend`'s job: the kernels package sits above this one,
and imports Triton only when it is chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from minipaged.attention.metadata import PagedMetadata

BACKENDS = ("reference", "torch", "triton", "auto")


class AttentionBackend(Protocol):
    """q: [num_tokens, num_heads, head_dim] packed; k, v: [num_tokens, num_kv_heads, head_dim];
    k_cache, v_cache: one layer's ``[num_blocks, block_size, num_kv_heads, head_dim]``."""

    name: str

    def plan(self, meta: PagedMetadata, block_size: int) -> Any:
        """Per-step facts every layer reuses (None if the backend needs none)."""
        ...

    def store_kvcache(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
    ) -> None: ...

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedMetadata, plan: Any
    ) -> torch.Tensor:
        """The packed queries attend to their sequences' paged K/V -> ``[num_tokens, num_heads, head_dim]``."""
        ...


def resolve_backend(name: str, device: torch.device | str = "cpu") -> str:
    """The backend ``name`` stands for on ``device`` (``"auto"`` decided here)."""
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return name
