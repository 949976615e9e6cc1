"""Reference solutions for stage 4 (notebook 04_triton_kernel)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from minipaged.utils import cdiv


@triton.jit
def store_kvcache_kernel(key, value, k_cache, v_cache, slot_mapping, key_stride, value_stride, D, D_PAD: tl.constexpr):
    """Program ``t`` copies token ``t``'s K and V rows to the row of its slot; slot -1 writes nothing."""
    t = tl.program_id(0).to(tl.int64)  # int64: t * stride can pass 2**31 on big batches
    slot = tl.load(slot_mapping + t)
    if slot < 0:
        return
    cols = tl.arange(0, D_PAD)
    lanes = cols < D  # D_PAD - D lanes past the row: never read or written
    k = tl.load(key + t * key_stride + cols, mask=lanes)
    tl.store(k_cache + slot * D + cols, k, mask=lanes)
    v = tl.load(value + t * value_stride + cols, mask=lanes)
    tl.store(v_cache + slot * D + cols, v, mask=lanes)


def online_softmax_update(
    m: torch.Tensor,
    l: torch.Tensor,  # noqa: E741  (the running sum's name in the flash-attention papers)
    acc: torch.Tensor,
    scores: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one KV tile into ``(m, l, acc)``; ``m`` starts finite (-1e30), so a masked tile gives no NaN."""
    m_new = torch.maximum(m, scores.max(dim=1).values)
    alpha = torch.exp(m - m_new)  # rescales what was accumulated under the old max
    p = torch.exp(scores - m_new[:, None])  # exp(-inf - finite) = 0 for masked keys
    return m_new, l * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ v


def tile_kv_end(context_len: int, q_len: int, q_tile: int, block_q: int) -> int:
    """One past the last key the tile's last query sees (the tile may run past ``q_len``)."""
    return min(context_len, context_len - q_len + (q_tile + 1) * block_q)


def count_loop_steps(
    q_lens: Sequence[int], context_lens: Sequence[int], num_kv_heads: int, block_q: int, block_n: int
) -> int:
    """Sum of ``cdiv(kv_end, block_n)`` over the programs that have queries."""
    num_tiles = cdiv(max(q_lens, default=0), block_q)
    steps = 0
    for q_len, context_len in zip(q_lens, context_lens):
        for t in range(num_tiles):
            if t * block_q < q_len:
                steps += cdiv(tile_kv_end(context_len, q_len, t, block_q), block_n)
    return steps * num_kv_heads
