"""Paged attention in Triton: one kernel for prefill and decode.

Semantics are those of :mod:`minipaged.attention.reference`: query ``i`` of a sequence with
``q_len`` new tokens and ``context_len`` cached tokens (the new ones included) sits at position
``context_len - q_len + i`` and attends to keys ``0 ..`` that position, read through the
sequence's block table; query head ``h`` uses KV head ``h // (num_heads // num_kv_heads)``.

Kernel design
-------------
Grid ``(num_seqs, num_kv_heads, cdiv(max_q_len, BLOCK_Q))``. One program owns one KV head of
one sequence and a tile of ``BLOCK_Q`` query tokens x the ``GROUP`` query heads that share this
KV head, flattened into ``BLOCK_M = BLOCK_Q * GROUP_PAD`` rows of a ``[BLOCK_M, HEAD_DIM_PAD]``
tile (row ``r`` = token ``r // GROUP_PAD``, head ``r % GROUP_PAD`` of the group). Every K/V
tile it loads therefore serves the whole group (GQA reads each KV head once per query tile),
and both matmuls are ``tl.dot``.

It walks the context in tiles of ``BLOCK_N`` key positions. Each position's physical block
comes from the block table (``block_tables[seq, pos // block_size]``, offset ``pos %
block_size``), so ``BLOCK_N`` is independent of the block size: a tile may span several small
blocks or part of a big one. The walk stops at the last position the tile's queries can see
(fully masked KV blocks are never read). Scores and the softmax state (running max, running
sum, rescaled accumulator) are fp32; the output is cast to q's dtype.

Decode is the same kernel with ``q_len = 1`` per sequence (``DECODE`` takes the query row from
the sequence index instead of ``cu_seqlens_q``, so no offsets tensor is built): ``BLOCK_Q = 1``
and the rows are the query-head group, padded to 16 for a valid GPU ``tl.dot``.

Numerics: under the interpreter (CPU) every load is converted to fp32 right away (its
bf16/fp16 arithmetic is wrong) and the dots are fp32. Compiled for a GPU, fp16/bf16 inputs go
to ``tl.dot`` as they are (fp32 accumulate, P cast to the input dtype as in FlashAttention) and
fp32 inputs use IEEE fp32 dots (no TF32), so fp32 results match the reference tightly. The
interpreter also casts fp32 -> bf16 by truncation; ``RTNE_BF16`` rounds to nearest even first
so its bf16 outputs round as torch's do.

Default tiles: ``BLOCK_M = 64`` query rows x ``BLOCK_N = 64`` keys on a GPU (32 keys for
fp32); 128 x 256 under the interpreter, whose cost is per program and per loop step rather
than per element. A sequence with no new tokens gets no work (its programs return at once).

Power-of-two tiles everywhere: ``HEAD_DIM_PAD = max(16, next_pow2(head_dim))`` with the extra
lanes masked, so any head_dim works (64 and 128 without padding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipaged.kernels._checks import check_decode, check_prefill
from minipaged.kernels.interpreter import INTERPRET, interpreting, launch

LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations: only constexprs have one
    Q,
    K_cache,
    V_cache,
    Out,
    block_tables,
    context_lens,
    cu_seqlens_q,
    scale_log2,
    block_size,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_bt,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DECODE: tl.constexpr,
    COMPUTE_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    RTNE_BF16: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2)
    if DECODE:
        q_start = seq
        q_len = 1
    else:
        q_start = tl.load(cu_seqlens_q + seq)
        q_len = tl.load(cu_seqlens_q + seq + 1) - q_start
    m0 = q_tile * BLOCK_Q
    if m0 >= q_len:  # empty sequence, or a tile past this sequence's queries
        return
    context_len = tl.load(context_lens + seq)

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    rows = tl.arange(0, BLOCK_M)
    tok = m0 + rows // GROUP_PAD  # query index within the sequence
    head = kv_head * GROUP + rows % GROUP_PAD
    row_ok = (tok < q_len) & (rows % GROUP_PAD < GROUP)
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM

    q_rows = (q_start + tok).to(tl.int64)
    q_ptrs = Q + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(COMPUTE_DTYPE)

    q_pos = context_len - q_len + tok  # absolute position of each row's query
    kv_end = tl.minimum(context_len, context_len - q_len + m0 + BLOCK_Q)  # last visible key + 1

    # The running max starts at -1e30, not -inf (notebook 04's last prediction asks why).
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    table = block_tables + seq * stride_bt
    for start in range(0, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < kv_end
        block = tl.load(table + pos // block_size, mask=pos_ok, other=0).to(tl.int64)
        offset = (pos % block_size).to(tl.int64)
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k_ptrs = K_cache + block[:, None] * stride_kb + offset[:, None] * stride_kt + kv_head * stride_kh
        k = tl.load(k_ptrs + d[None, :] * stride_kd, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        visible = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = V_cache + block[:, None] * stride_vb + offset[:, None] * stride_vt + kv_head * stride_vh
        v = tl.load(v_ptrs + d[None, :] * stride_vd, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    if RTNE_BF16:  # the interpreter casts fp32 -> bf16 by truncation: round to nearest even first
        bits = acc.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        acc = bits.to(tl.float32, bitcast=True)
    o_ptrs = Out + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


# ---------------------------------------------------------------------------------------------
# Host side: tile sizes, launch, the two wrappers (their argument checks: kernels/_checks.py).


def kernel_constexprs(
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_q_len: int,
    decode: bool,
    block_m: int | None = None,
    block_n: int | None = None,
    *,
    interpret: bool = INTERPRET,
) -> dict:
    """The compile-time parameters (tile sizes, numerics) of a launch, compiled or (``interpret``)
    in Triton's interpreter; also what an ahead-of-time compile of :func:`_paged_attention_kernel` needs."""
    # The interpreter pays per program and per loop step, not per element: it takes big tiles.
    if block_n is None:  # fp32 tiles take twice the registers and shared memory of 16-bit ones on a GPU
        block_n = 256 if interpret else (32 if dtype == torch.float32 else 64)
    block_m = (128 if interpret else 64) if block_m is None else block_m
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    group = num_heads // num_kv_heads
    if decode:  # one query token: the rows are the head group, padded to tl.dot's 16
        block_q, group_pad = 1, max(16, triton.next_power_of_2(group))
    else:
        group_pad = triton.next_power_of_2(group)
        block_q = max(1, min(block_m // group_pad, triton.next_power_of_2(max(max_q_len, 1))))
        group_pad = max(group_pad, 16 // block_q)
    if interpret or dtype == torch.float32:
        compute_dtype, precision = tl.float32, "ieee"
    else:
        compute_dtype, precision = (tl.float16 if dtype == torch.float16 else tl.bfloat16), "tf32"
    return dict(
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        DECODE=decode,
        COMPUTE_DTYPE=compute_dtype,
        DOT_PRECISION=precision,
        RTNE_BF16=interpret and dtype == torch.bfloat16,
    )


def _launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float | None,
    max_q_len: int,
    decode: bool,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    (num_heads, head_dim), num_seqs, num_kv_heads = q.shape[1:], block_tables.shape[0], k_cache.shape[2]
    interpret = interpreting(q.device)
    consts = kernel_constexprs(
        q.dtype, num_heads, num_kv_heads, head_dim, max_q_len, decode, block_m, block_n, interpret=interpret
    )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0 or num_seqs == 0 or max_q_len == 0:
        return out
    scale = head_dim**-0.5 if scale is None else float(scale)
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_q_len, consts["BLOCK_Q"]))
    launch(
        _paged_attention_kernel,
        grid,
        q.device,
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        context_lens,
        cu_seqlens_q,
        scale * LOG2E,
        k_cache.shape[1],
        *q.stride(),
        *out.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        block_tables.stride(0),
        **consts,
    )
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    block_n: int | None = None,
) -> torch.Tensor:
    """One new query token per sequence. q: [num_seqs, num_heads, head_dim] -> same shape, q's dtype.

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]; block_tables: int32
    [num_seqs, max_blocks]; context_lens: int32 [num_seqs] (>= 1, the new token included).
    ``block_n`` (keyword, power of two >= 16) sets the KV positions per loop step.
    """
    check_decode(q, k_cache, v_cache, block_tables, context_lens)
    # context_lens stands in for the unused cu_seqlens_q pointer
    return _launch(q, k_cache, v_cache, block_tables, context_lens, context_lens, scale, 1, True, block_n=block_n)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    max_q_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Packed new queries attend causally to their sequences' paged K/V.

    q: [total_new_tokens, num_heads, head_dim]; cu_seqlens_q: int32 [num_seqs + 1] (sequence
    ``i``'s queries are rows ``cu_seqlens_q[i] .. cu_seqlens_q[i+1] - 1``); context_lens: int32
    [num_seqs] (>= that sequence's q_len). Returns [total_new_tokens, num_heads, head_dim] in q's
    dtype. Keywords: ``max_q_len`` (the longest q_len; passing it saves a device sync),
    ``block_m`` (query rows per program, tokens x group heads) and ``block_n`` (KV positions per
    loop step), both powers of two >= 16.
    """
    check_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    if max_q_len is None:
        max_q_len = int(cu_seqlens_q.diff().max()) if block_tables.shape[0] else 0
    args = (q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale, max_q_len, False, block_m, block_n)
    return _launch(*args)
