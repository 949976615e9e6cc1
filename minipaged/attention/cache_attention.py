"""How the model's attention layers reach a KV cache: ``attn.attend(layer, q, k, v)``.

Every attention layer of the decoder calls ``attend`` with this step's new tokens, packed:
``q: [num_tokens, num_heads, head_dim]``, ``k, v: [num_tokens, num_kv_heads, head_dim]`` (RoPE
already applied). The object decides where K/V go and what they attend to, so each stage plugs
a new cache into the same model:

- :class:`RecomputeAttention`: no cache, the whole sequence is passed every step (the oracle);
- :class:`ContiguousAttention` (stage 0): one reserved range of slots per sequence;
- :class:`PagedAttention` (stages 3-5): a block pool, written by ``slot_mapping`` and read
  through ``block_tables``, by an attention backend (:mod:`minipaged.attention.backends`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import torch

from minipaged.attention import reference
from minipaged.attention.backends import AttentionBackend, ReferenceBackend
from minipaged.attention.metadata import PagedMetadata
from minipaged.kv.contiguous import ContiguousKVCache

__all__ = ["CacheAttention", "ContiguousAttention", "PagedAttention", "PagedMetadata", "RecomputeAttention"]


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
    ``set_batch`` takes the step's metadata and lets the backend plan once for every layer.
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
        attend = self.backend.decode if m.is_decode else self.backend.prefill
        return attend(q, k_cache, v_cache, m, self.plan)


class ContiguousAttention:
    """Stage 0's cache under the same attention: each sequence's buffer is a range of slots.

    A contiguous reservation is a paged cache whose blocks hold one token each and whose block
    table is ``start, start + 1, ...``: so the same paged operations serve it, and comparing the
    two caches compares memory management alone, not two attention implementations. The cache's
    own record of how many tokens each sequence holds is its owner's to keep (``cache.write``, or
    the runner that set the batch).
    """

    def __init__(self, cache: ContiguousKVCache, backend: AttentionBackend | None = None) -> None:
        self.cache = cache
        # [num_layers, num_slots, kv_heads, d] viewed as [num_layers, num_slots, 1, kv_heads, d]
        self.paged = PagedAttention(cache.k.unsqueeze(2), cache.v.unsqueeze(2), backend or ReferenceBackend())
        self.q_lens: list[int] = []

    def set_batch(self, seq_ids: Sequence[Hashable], q_lens: Sequence[int], context_lens: Sequence[int]) -> None:
        """Sequence ``i`` brings ``q_lens[i]`` new tokens (packed in this order) and holds
        ``context_lens[i]`` tokens once they are written."""
        if not len(seq_ids) == len(q_lens) == len(context_lens):
            raise ValueError("seq_ids, q_lens and context_lens must have the same length")
        starts = []
        for seq_id, q_len, context_len in zip(seq_ids, q_lens, context_lens):
            if not 0 <= q_len <= context_len:
                raise ValueError(f"sequence {seq_id!r}: need 0 <= q_len ({q_len}) <= context_len ({context_len})")
            # Fail before layer 0 writes anything rather than halfway through the batch.
            self.cache.check_fits(seq_id, context_len)
            starts.append(self.cache.arena.span(seq_id)[0])
        tables = [range(s, s + c) for s, c in zip(starts, context_lens)]
        cached = [c - n for c, n in zip(context_lens, q_lens)]
        self.q_lens = list(q_lens)
        self.paged.set_batch(PagedMetadata.build(tables, cached, q_lens, 1, self.cache.k.device))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim] -> like q."""
        if q.shape[0] != sum(self.q_lens):
            raise ValueError(f"got {q.shape[0]} tokens, set_batch announced {sum(self.q_lens)}")
        return self.paged.attend(layer, q, k, v)
