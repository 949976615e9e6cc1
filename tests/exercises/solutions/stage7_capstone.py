"""Reference solutions for stage 7, the capstone: the paged decode attention kernel in six puzzles.

Each kernel is the one before it plus one idea, as a learner writes them; the planted-bug checks
(``tests/exercises/test_stage7_capstone_checker.py``) edit single lines of this file, so keep
those lines as they are or update the bugs with them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def block_scores_kernel(
    q,
    k_cache,
    out,
    block_id,
    kv_head,
    scale,
    block_size,
    num_kv_heads,
    head_dim,
    BLOCK: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """``out[t] = scale * q . k_cache[block_id, t, kv_head]`` for the block's slots ``t``."""
    t = tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM_PAD)
    t_ok, d_ok = t < block_size, d < head_dim
    qv = tl.load(q + d, mask=d_ok, other=0.0).to(tl.float32)
    slot = block_id.to(tl.int64) * block_size + t  # int64: a big cache holds more than 2**31 numbers
    rows = (slot * num_kv_heads + kv_head) * head_dim
    k = tl.load(k_cache + rows[:, None] + d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    s = tl.sum(k * qv[None, :], axis=1) * scale
    tl.store(out + t, s, mask=t_ok)


@triton.jit
def tail_attention_kernel(
    q,
    k_cache,
    v_cache,
    out,
    block_id,
    n,
    kv_head,
    scale,
    block_size,
    num_kv_heads,
    head_dim,
    BLOCK: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """Attention of ``q`` over the first ``n`` slots of one block: the slots past ``n`` are masked."""
    t = tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM_PAD)
    t_ok, d_ok = t < n, d < head_dim
    qv = tl.load(q + d, mask=d_ok, other=0.0).to(tl.float32)
    rows = ((block_id.to(tl.int64) * block_size + t) * num_kv_heads + kv_head) * head_dim
    mask = t_ok[:, None] & d_ok[None, :]
    k = tl.load(k_cache + rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
    s = tl.sum(k * qv[None, :], axis=1) * scale
    s = tl.where(t_ok, s, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    v = tl.load(v_cache + rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
    o = tl.sum(p[:, None] * v, axis=0) / tl.sum(p, axis=0)
    tl.store(out + d, o, mask=d_ok)


@triton.jit
def online_attention_kernel(
    q,
    k_cache,
    v_cache,
    out,
    context_len,
    kv_head,
    scale,
    block_size,
    num_kv_heads,
    head_dim,
    BLOCK: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """Attention over a sequence kept in blocks 0, 1, 2, ... in order: one block per step, online softmax."""
    t = tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < head_dim
    qv = tl.load(q + d, mask=d_ok, other=0.0).to(tl.float32)
    m_i = -1.0e30  # finite: exp(m_i - m_new) is 0 on the first step, never NaN
    l_i = 0.0
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    for j in range(0, tl.cdiv(context_len, block_size)):
        block = j
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
    tl.store(out + d, acc / l_i, mask=d_ok)


@triton.jit
def paged_attention_kernel(
    q,
    k_cache,
    v_cache,
    out,
    block_table,
    context_len,
    kv_head,
    scale,
    block_size,
    num_kv_heads,
    head_dim,
    BLOCK: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """Puzzle 3's walk, each logical block ``j`` read from physical block ``block_table[j]``."""
    t = tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < head_dim
    qv = tl.load(q + d, mask=d_ok, other=0.0).to(tl.float32)
    m_i = -1.0e30
    l_i = 0.0
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    for j in range(0, tl.cdiv(context_len, block_size)):
        block = tl.load(block_table + j)
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
    tl.store(out + d, acc / l_i, mask=d_ok)


@triton.jit
def gqa_attention_kernel(
    q,
    k_cache,
    v_cache,
    out,
    block_table,
    context_len,
    group,
    scale,
    block_size,
    num_kv_heads,
    head_dim,
    BLOCK: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """Program ``h`` is query head ``h`` of one sequence; it reads KV head ``h // group``."""
    head = tl.program_id(0)
    kv_head = head // group
    t = tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < head_dim
    qv = tl.load(q + head * head_dim + d, mask=d_ok, other=0.0).to(tl.float32)
    m_i = -1.0e30
    l_i = 0.0
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    for j in range(0, tl.cdiv(context_len, block_size)):
        block = tl.load(block_table + j)
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
    tl.store(out + head * head_dim + d, acc / l_i, mask=d_ok)


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
    """Program ``(s, h)``: query head ``h`` of sequence ``s``, through row ``s`` of the block tables."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // group
    context_len = tl.load(context_lens + seq)
    table = block_tables + seq.to(tl.int64) * max_blocks
    row = (seq.to(tl.int64) * num_heads + head) * head_dim  # q and out: [num_seqs, num_heads, head_dim]
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


@triton.jit
def paged_prefill_kernel(
    q,
    k_cache,
    v_cache,
    out,
    block_table,
    context_len,
    q_len,
    scale,
    num_heads,
    group,
    block_size,
    num_kv_heads,
    head_dim,
    BLOCK: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    """Program ``(i, h)``: query head ``h`` of new token ``i``, at position ``context_len - q_len + i``."""
    i = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // group
    pos = context_len - q_len + i
    row = (i.to(tl.int64) * num_heads + head) * head_dim  # q and out: [q_len, num_heads, head_dim]
    t = tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < head_dim
    qv = tl.load(q + row + d, mask=d_ok, other=0.0).to(tl.float32)
    m_i = -1.0e30
    l_i = 0.0
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    for j in range(0, pos // block_size + 1):  # the causal mask: no block past the token's own
        block = tl.load(block_table + j)
        t_ok = (t < block_size) & (j * block_size + t <= pos)  # and no slot past it in that block
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
