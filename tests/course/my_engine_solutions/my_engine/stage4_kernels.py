"""Stage 4 (notebook 04, the Triton track): the K/V write and the paged decode attention as Triton kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipaged.kernels.interpreter import launch


@triton.jit
def store_kv_kernel(key, value, k_cache, v_cache, slot_mapping, key_stride, value_stride, D, D_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping + t)
    if slot < 0:
        return
    cols = tl.arange(0, D_PAD)
    lanes = cols < D
    k = tl.load(key + t * key_stride + cols, mask=lanes)
    tl.store(k_cache + slot * D + cols, k, mask=lanes)
    v = tl.load(value + t * value_stride + cols, mask=lanes)
    tl.store(v_cache + slot * D + cols, v, mask=lanes)


def store_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Given: launches ``store_kv_kernel``, one program per token."""
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    key, value = key.reshape(num_tokens, -1), value.reshape(num_tokens, -1)
    d = k_cache.shape[2] * k_cache.shape[3]
    launch(
        store_kv_kernel,
        (num_tokens,),
        k_cache.device,
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        value.stride(0),
        d,
        D_PAD=triton.next_power_of_2(d),
    )


@triton.jit
def paged_decode_kernel(
    q,
    k_cache,
    v_cache,
    out,
    block_tables,
    context_lens,
    scale,
    max_blocks,
    num_heads,
    group,
    block_size,
    num_kv_heads,
    head_dim,
    BLOCK: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // group
    context_len = tl.load(context_lens + seq)
    table = block_tables + seq.to(tl.int64) * max_blocks
    row = (seq.to(tl.int64) * num_heads + head) * head_dim
    t = tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < head_dim
    qv = tl.load(q + row + d, mask=d_ok, other=0.0).to(tl.float32)
    m_i = -1.0e30
    l_i = 0.0
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    for j in range(0, tl.cdiv(context_len, block_size)):
        block = tl.load(table + j)
        t_ok = (t < block_size) & (j * block_size + t < context_len)
        rows = ((block.to(tl.int64) * block_size + t) * num_kv_heads + kv_head) * head_dim
        mask = t_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache + rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        s = tl.where(t_ok, tl.sum(k * qv[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_cache + rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    tl.store(out + row + d, (acc / l_i).to(out.dtype.element_ty), mask=d_ok)


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale=None) -> torch.Tensor:
    """Given: launches ``paged_decode_kernel``, program ``(sequence, query head)``."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    q, block_tables = q.contiguous(), block_tables.contiguous()
    out = torch.empty_like(q)
    scale = head_dim**-0.5 if scale is None else scale
    launch(
        paged_decode_kernel,
        (num_seqs, num_heads),
        q.device,
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        context_lens,
        scale,
        block_tables.shape[1],
        num_heads,
        num_heads // num_kv_heads,
        block_size,
        num_kv_heads,
        head_dim,
        BLOCK=triton.next_power_of_2(block_size),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
    )
    return out
