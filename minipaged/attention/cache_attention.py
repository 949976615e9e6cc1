"""How the model's attention layers reach a KV cache: ``attn.attend(layer, q, k, v)``.

Every attention layer of the decoder calls ``attend`` with this step's new tokens, packed:
``q: [num_tokens, num_heads, head_dim]``, ``k, v: [num_tokens, num_kv_heads, head_dim]`` (RoPE
already applied). The object decides where K/V go and what they attend to, so each stage plugs
a new cache into the same model:

- :class:`RecomputeAttention`: no cache, the whole sequence is passed every step (the oracle);
- :class:`PagedAttention` (stages 3-5): a block pool, written by ``slot_mapping`` and read
  through ``block_tables``, by an attention backend (:mod:`minipaged.attention.backends`).
  Stage 0's contiguous reservations are read by it too, as pools of one-slot blocks
  (:meth:`minipaged.kv.contiguous.FirstFitArena.table`).

**What one step tells every paged layer** is :class:`~minipaged.attention.metadata.PagedMetadata`,
built once per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from minipaged.attention import reference
from minipaged.attention.metadata import PagedMetadata

if TYPE_CHECKING:
    from minipaged.attention.backends import AttentionBackend

__all__ = ["CacheAttention", "PagedAttention", "PagedMetadata", "RecomputeAttention"]


class CacheAttention(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class RecomputeAttention:
    """No cache: causal attention within each packed sequence (``cu_seqlens: [num_seqs + 1]``)."""

    def __init__(self, cu_seqlens: torch.Tensor) -> None:
        self.cu_seqlens = cu_seqlens

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return reference.varlen_attention(q, k, v, self.cu_seqlens)


class PagedAttention:
    """Writes each layer's new K/V by ``slot_mapping``, then attends through ``block_tables``.

    k_cache, v_cache: ``[num_layers, num_blocks, block_size, num_kv_heads, head_dim]``.
    ``set_batch`` takes the step's metadata and lets the backend plan once for every layer
    (whatever the backend decides from the step's lengths, such as a decode-only launch, is
    decided there); ``attend`` is then one ``store_kvcache`` and one ``backend.attend`` a layer.
    """

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, backend: AttentionBackend) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache
        self.backend = backend
        self.meta: PagedMetadata | None = None
        self.plan: Any = None

    def set_batch(self, meta: PagedMetadata) -> None:
        self.meta = meta
        self.plan = self.backend.plan(meta, self.k_cache.shape[2])

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        m = self.meta
        if m is None:
            raise RuntimeError("call set_batch(meta) before the forward")
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        self.backend.store_kvcache(k, v, k_cache, v_cache, m.slot_mapping)
        return self.backend.attend(q, k_cache, v_cache, m, self.plan)
