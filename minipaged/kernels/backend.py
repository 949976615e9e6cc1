"""The Triton kernels behind the attention backend interface
(:class:`minipaged.attention.backends.AttentionBackend`).

The kernel module has one kernel and two launches: prefill (any mix of sequences, packed by
``cu_seqlens_q``, a grid sized by the longest ``q_len``) and decode (one query per sequence, its
row found from the sequence index). Which one a step takes depends on its lengths alone, so
:meth:`TritonBackend.plan` decides it once per step and every layer's ``attend`` follows it.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from minipaged.attention.metadata import PagedMetadata
from minipaged.kernels.paged_attention import paged_decode_attention, paged_prefill_attention
from minipaged.kernels.store import store_kvcache


class TritonPlan(NamedTuple):
    """``max_q_len``: the longest ``q_len``, the prefill grid's size (known on the host, so no
    layer reads it back from the device); ``decode``: every sequence brings exactly one token."""

    max_q_len: int
    decode: bool


class TritonBackend:
    """The decode launch for steps of one token per sequence, the prefill launch for the rest."""

    name = "triton"
    store_kvcache = staticmethod(store_kvcache)

    def plan(self, meta: PagedMetadata, block_size: int) -> TritonPlan:
        # A sequence with no new token has no query row, so max_q_len == 1 alone is not enough.
        return TritonPlan(meta.max_q_len, all(n == 1 for n in meta.host_q_lens))

    def attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: PagedMetadata, plan: TritonPlan) -> Tensor:
        qc = q.to(k_cache.dtype)  # the kernels take q in the cache's dtype (a bf16 cache under dtype="auto")
        if plan.decode:
            out = paged_decode_attention(qc, k_cache, v_cache, meta.block_tables, meta.context_lens)
        else:
            out = paged_prefill_attention(
                qc, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens, max_q_len=plan.max_q_len
            )
        return out.to(q.dtype)
