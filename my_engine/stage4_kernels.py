"""Stage 4 (notebook 04, the Triton track): the K/V write and the paged decode attention as Triton kernels.

You write the ``@triton.jit`` bodies; the launchers under each kernel are given. On a CPU the
kernels run in Triton's interpreter (``print`` inside a kernel shows values; a store outside the
cache corrupts memory, so mask every lane). Check: the last cell of notebook 04, or ``python -m
exercises my_engine 4``; the checks compare with stage 3's torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipaged.kernels.interpreter import launch


@triton.jit
def store_kv_kernel(key, value, k_cache, v_cache, slot_mapping, key_stride, value_stride, D, D_PAD: tl.constexpr):
    """**core** — program ``t`` copies token ``t``'s K and V rows (``D = num_kv_heads * head_dim`` numbers,
    ``key_stride`` / ``value_stride`` apart) to row ``slot_mapping[t]`` of the caches; slot -1 writes nothing.
    ``D_PAD``: the next power of two of ``D``: mask the lanes ``>= D``."""
    raise NotImplementedError("store_kv_kernel: load the slot, return if -1, masked loads and stores of D numbers")


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
    """**stretch** — program ``(s, h)``: query head ``h`` of sequence ``s``, one block of the context per loop step.

    Scores ``scale * q . k`` over the first ``context_lens[s]`` keys, read through row ``s`` of
    ``block_tables`` (``max_blocks`` wide); KV head ``h // group``; an online softmax (running max
    ``m``, running sum ``l``, rescaled accumulator) in fp32 (``.to(tl.float32)`` after every load);
    store in ``out``'s dtype. ``BLOCK``, ``HEAD_DIM_PAD``: powers of two at least ``block_size``, ``head_dim``."""
    raise NotImplementedError(
        "paged_decode_kernel: loop over cdiv(context_len, block_size) blocks with an online softmax"
    )


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
