"""The Triton kernels behind the attention backend interface
(:class:`minipaged.attention.backends.AttentionBackend`)."""

from __future__ import annotations

from torch import Tensor

from minipaged.attention.metadata import PagedMetadata
from minipaged.kernels.paged_attention import paged_decode_attention, paged_prefill_attention
from minipaged.kernels.store import store_kvcache


class TritonBackend:
    """Prefill's launch grid needs the longest ``q_len``: planned once per step, not read back per layer."""

    name = "triton"
    store_kvcache = staticmethod(store_kvcache)

    def plan(self, meta: PagedMetadata, block_size: int) -> int:
        return meta.max_q_len

    def prefill(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: PagedMetadata, plan: int) -> Tensor:
        return paged_prefill_attention(
            q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens, max_q_len=plan
        )

    def decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: PagedMetadata, plan: int) -> Tensor:
        return paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens)
