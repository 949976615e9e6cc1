"""How the model's attention layers reach a KV cache.

Every attention layer calls ``backend.attend(layer, q, k, v)`` with this step's new tokens,
packed: ``q: [num_tokens, num_heads, head_dim]``, ``k, v: [num_tokens, num_kv_heads, head_dim]``
(RoPE already applied). The backend decides where K/V go and what they attend to, so each stage
plugs a new cache into the same model:

- :class:`RecomputeBackend`: no cache, the whole sequence is passed every step (the oracle);
- ``ContiguousBackend`` (stage 0, :mod:`minipaged.kv.contiguous`): per-sequence buffers;
- :class:`PagedBackend` (stages 3-4): a block pool, written by ``slot_mapping`` and read through
  ``block_tables`` with the torch reference or the Triton kernels.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Protocol

import torch

from minipaged.attention import reference
from minipaged.kv import slot_mapping as torch_store
from minipaged.kv.slot_mapping import PagedKVCache

BACKENDS = ("torch", "triton", "auto")


class AttentionBackend(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


def resolve_backend(name: str, device: torch.device | str = "cpu") -> str:
    """``"auto"`` is Triton on a CUDA device and torch elsewhere (the CPU interpreter is slow)."""
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return name


def get_ops(name: str, device: torch.device | str = "cpu") -> types.SimpleNamespace:
    """The three paged operations (``store_kvcache``, ``paged_prefill_attention``,
    ``paged_decode_attention``) of one backend; both backends share names and shapes."""
    if resolve_backend(name, device) == "triton":
        from minipaged import kernels as ops_module
    else:
        ops_module = types.SimpleNamespace(
            store_kvcache=torch_store.store_kvcache,
            paged_prefill_attention=reference.paged_prefill_attention,
            paged_decode_attention=reference.paged_decode_attention,
        )
    return types.SimpleNamespace(
        store_kvcache=ops_module.store_kvcache,
        paged_prefill_attention=ops_module.paged_prefill_attention,
        paged_decode_attention=ops_module.paged_decode_attention,
    )


class RecomputeBackend:
    """No cache: causal attention within each packed sequence (``cu_seqlens: [num_seqs + 1]``)."""

    def __init__(self, cu_seqlens: torch.Tensor) -> None:
        self.cu_seqlens = cu_seqlens

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return reference.varlen_attention(q, k, v, self.cu_seqlens)


@dataclass
class PagedMetadata:
    """What one engine step tells the paged attention layers.

    slot_mapping: int64 [num_tokens] (-1 = do not write); block_tables: int32 [num_seqs,
    max_blocks]; context_lens: int32 [num_seqs] (tokens in the cache after this step's write);
    cu_seqlens_q: int32 [num_seqs + 1] (the packing of the new tokens).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor

    @property
    def is_decode(self) -> bool:
        """Every sequence brings exactly one new token."""
        return self.slot_mapping.numel() == self.context_lens.numel()


class PagedBackend:
    """Writes each layer's new K/V by ``slot_mapping``, then attends through ``block_tables``."""

    def __init__(self, cache: PagedKVCache, ops: str = "torch") -> None:
        self.cache = cache
        self.ops = get_ops(ops, cache.k.device)
        self.meta: PagedMetadata | None = None

    def set_batch(self, meta: PagedMetadata) -> None:
        self.meta = meta

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        m = self.meta
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
        self.ops.store_kvcache(k, v, k_cache, v_cache, m.slot_mapping)
        if m.is_decode:
            return self.ops.paged_decode_attention(q, k_cache, v_cache, m.block_tables, m.context_lens)
        return self.ops.paged_prefill_attention(q, k_cache, v_cache, m.block_tables, m.cu_seqlens_q, m.context_lens)
