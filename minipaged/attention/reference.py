"""The oracle: plain, per-sequence PyTorch attention that every other path is checked against.

Written to be read, not to be fast: the paged operations loop over the batch's sequences in
Python and gather each one's K/V on its own. :mod:`minipaged.attention.batched` (the engine's
CPU default) and :mod:`minipaged.kernels` (Triton) offer the same three operations —
``store_kvcache``, ``paged_prefill_attention``, ``paged_decode_attention`` — with the same
names, shapes and semantics, and the tests hold them to this module.

One rule serves prefill and decode alike. A sequence has ``context_len`` tokens of keys and
values (the new ones included) and ``q_len`` new query tokens; query ``i`` sits at position
``context_len - q_len + i`` and sees keys ``0 .. that position``. Grouped-query attention maps
query head ``h`` to KV head ``h // (num_heads // num_kv_heads)``. Scores and softmax are fp32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minipaged.utils import cdiv

if TYPE_CHECKING:
    from minipaged.attention.metadata import PagedMetadata


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Attention of one sequence's new queries over its whole context.

    q: [q_len, num_heads, head_dim]; k, v: [context_len, num_kv_heads, head_dim] with
    context_len >= q_len. Returns [q_len, num_heads, head_dim] in q's dtype.
    """
    q_len, num_heads, head_dim = q.shape
    context_len, num_kv_heads, _ = k.shape
    if context_len < q_len:
        raise ValueError(f"context_len ({context_len}) must be >= q_len ({q_len})")
    scale = head_dim**-0.5 if scale is None else scale
    group = num_heads // num_kv_heads
    k = k.float().repeat_interleave(group, dim=1)  # [context_len, num_heads, head_dim]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    q_pos = torch.arange(context_len - q_len, context_len, device=q.device)
    k_pos = torch.arange(context_len, device=q.device)
    scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """No cache at all: causal attention inside each packed sequence.

    q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim];
    cu_seqlens: [num_seqs + 1] offsets of each sequence in the packed tokens.
    """
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        out[start:end] = causal_attention(q[start:end], k[start:end], v[start:end], scale)
    return out


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """Read one sequence's first ``context_len`` tokens out of a paged cache, in logical order.

    cache: [num_blocks, block_size, num_kv_heads, head_dim]; block_table: [>= ceil(context_len /
    block_size)] physical block ids. Returns [context_len, num_kv_heads, head_dim].
    """
    block_size = cache.shape[1]
    num_blocks = cdiv(context_len, block_size)
    blocks = cache[block_table[:num_blocks].long()]  # [num_blocks, block_size, kv_heads, head_dim]
    return blocks.reshape(-1, *cache.shape[2:])[:context_len]


def store_kvcache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write new K/V into the paged cache, in place; slot -1 writes nothing.

    key, value: [num_tokens, num_kv_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size,
    num_kv_heads, head_dim]; slot_mapping: int64 [num_tokens]. Viewing the cache as
    ``[num_slots, num_kv_heads, head_dim]`` makes the write one scatter by slot.
    """
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep].to(v_cache.dtype)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Packed new queries attend to their sequences' cached K/V, read through block tables.

    q: [total_new_tokens, num_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size,
    num_kv_heads, head_dim]; block_tables: int32 [num_seqs, max_blocks]; cu_seqlens_q: int32
    [num_seqs + 1]; context_lens: int32 [num_seqs] (cached tokens, the new ones included).
    Returns [total_new_tokens, num_heads, head_dim].
    """
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    for i, context_len in enumerate(context_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if end == start:
            continue
        k = gather_kv(k_cache, block_tables[i], context_len)
        v = gather_kv(v_cache, block_tables[i], context_len)
        out[start:end] = causal_attention(q[start:end], k, v, scale)
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """One new query token per sequence: q: [num_seqs, num_heads, head_dim] -> same shape.

    The decode case of :func:`paged_prefill_attention` (every ``q_len`` is 1).
    """
    cu_seqlens_q = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)


class ReferenceBackend:
    """The oracle as an attention backend (:mod:`minipaged.attention.backends`): one sequence at a
    time. Its prefill rule covers decode (a sequence with one new token is a prefill of length 1),
    so every step takes the same path."""

    name = "reference"
    store_kvcache = staticmethod(store_kvcache)

    def plan(self, meta: PagedMetadata, block_size: int) -> None:
        return None

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedMetadata, plan: None
    ) -> torch.Tensor:
        return paged_prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens)
