"""Stage 3 (notebook 03): slot mapping, the K/V write, and paged attention in torch.

Shapes (vLLM's): ``k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]``;
``block_tables: int32 [num_seqs, max_blocks]`` (rows padded with 0); ``context_lens: int32
[num_seqs]`` (cached tokens, the new ones included); ``slot_mapping: int64 [num_tokens]``,
``slot = block_id * block_size + offset``, ``-1`` = write nothing. Query head ``h`` reads KV head
``h // (num_heads // num_kv_heads)``; softmax in fp32. Check: the last cell of notebook 03, or
``python -m exercises my_engine 3``.
"""

from __future__ import annotations

import torch


def slot_mapping(block_tables: list[list[int]], starts: list[int], ends: list[int], block_size: int) -> torch.Tensor:
    """**core** — int64 slots of positions ``starts[i] .. ends[i] - 1`` of every sequence, packed in order.

    ``slot_mapping([[5, 2, 7]], [0], [10], 4)`` is ``[20, 21, 22, 23, 8, 9, 10, 11, 28, 29]``.
    """
    raise NotImplementedError("slot_mapping: block_table[pos // block_size] * block_size + pos % block_size")


def store_kv(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """**core** — write token ``t``'s K and V (``[num_tokens, num_kv_heads, head_dim]``) at slot ``slot_mapping[t]``.

    In place; a slot of ``-1`` (a padding token) writes nothing.
    """
    raise NotImplementedError("store_kv: the cache viewed as [num_slots, num_kv_heads, head_dim], rows by slot")


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """**core** — one new query per sequence, ``q: [num_seqs, num_heads, head_dim]`` -> the same shape.

    Sequence ``i`` attends to its first ``context_lens[i]`` keys, read through ``block_tables[i]``
    (keys past ``context_lens[i]`` are not read). ``scale`` defaults to ``head_dim ** -0.5``.
    """
    raise NotImplementedError("paged_decode_attention: gather each sequence's K/V by its table, softmax(q.k * scale) v")


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """**stretch** — many new queries per sequence, packed: sequence ``i`` owns rows ``cu_seqlens_q[i] .. [i + 1] - 1``.

    Its query ``j`` of ``q_len`` sits at position ``context_lens[i] - q_len + j`` and sees keys 0 ..
    that position (causal). A chunk of a long prompt, or the rest of one after a prefix hit, does
    not start at position 0.
    """
    raise NotImplementedError("paged_prefill_attention: the causal mask, shifted by context_len - q_len")
