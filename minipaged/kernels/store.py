"""Write a batch's new K/V into the paged cache by slot, in Triton.

Same contract as :func:`minipaged.attention.reference.store_kvcache`: token ``t`` goes to slot
``slot_mapping[t] = block_id * block_size + offset``; slot -1 writes nothing.

Grid ``(cdiv(num_tokens, BLOCK_T), cdiv(num_kv_heads * head_dim, BLOCK_C))``: a program copies
a ``[BLOCK_T tokens, BLOCK_C (head, dim) columns]`` tile of key and of value. Every load and
store is masked (skipped slots, the ragged last tiles): the interpreter has no bounds checks.
New K/V of another dtype than the cache are converted by torch first (only the new tokens):
the interpreter's own fp32 -> bf16 cast truncates instead of rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minipaged.kernels._checks import check_store
from minipaged.kernels.interpreter import INTERPRET, interpreting, launch


@triton.jit
def _store_kvcache_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations: only constexprs have one
    Key,
    Value,
    K_cache,
    V_cache,
    slot_mapping,
    num_tokens,
    block_size,
    stride_s,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_kcd,
    stride_vcb,
    stride_vct,
    stride_vch,
    stride_vcd,
    HEAD_DIM: tl.constexpr,
    NUM_COLS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    t_ok = t < num_tokens
    slot = tl.load(slot_mapping + t * stride_s, mask=t_ok, other=-1).to(tl.int64)
    write = t_ok & (slot >= 0)
    mask = write[:, None] & (c < NUM_COLS)[None, :]
    slot = tl.where(write, slot, 0)
    block = slot // block_size
    offset = slot % block_size
    head = (c // HEAD_DIM)[None, :]
    d = (c % HEAD_DIM)[None, :]
    t64 = t.to(tl.int64)[:, None]

    k = tl.load(Key + t64 * stride_kt + head * stride_kh + d * stride_kd, mask=mask)
    k_dst = K_cache + block[:, None] * stride_kcb + offset[:, None] * stride_kct + head * stride_kch + d * stride_kcd
    tl.store(k_dst, k, mask=mask)
    v = tl.load(Value + t64 * stride_vt + head * stride_vh + d * stride_vd, mask=mask)
    v_dst = V_cache + block[:, None] * stride_vcb + offset[:, None] * stride_vct + head * stride_vch + d * stride_vcd
    tl.store(v_dst, v, mask=mask)


def store_constexprs(num_tokens: int, num_kv_heads: int, head_dim: int, *, interpret: bool = INTERPRET) -> dict:
    """Tile sizes of a launch, compiled or (``interpret``) in Triton's interpreter (also what an
    ahead-of-time compile needs)."""
    num_cols = num_kv_heads * head_dim
    block_c = min(triton.next_power_of_2(num_cols), 1024)
    budget = 1 << 16 if interpret else 1 << 12  # elements per tile: the interpreter wants few programs
    block_t = max(1, min(triton.next_power_of_2(num_tokens), budget // block_c))
    return dict(HEAD_DIM=head_dim, NUM_COLS=num_cols, BLOCK_T=block_t, BLOCK_C=block_c)


def store_kvcache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write new K/V into the paged cache, in place; slot -1 writes nothing.

    key, value: [num_tokens, num_kv_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size,
    num_kv_heads, head_dim]; slot_mapping: int64 (or int32) [num_tokens].
    """
    check_store(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if key.dtype != k_cache.dtype or value.dtype != v_cache.dtype:
        # Convert the new tokens with torch (round to nearest even), not in the kernel: the
        # interpreter's fp32 -> bf16 cast truncates. Only the new tokens are copied.
        key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
    consts = store_constexprs(num_tokens, num_kv_heads, head_dim, interpret=interpreting(key.device))
    grid = (triton.cdiv(num_tokens, consts["BLOCK_T"]), triton.cdiv(consts["NUM_COLS"], consts["BLOCK_C"]))
    launch(
        _store_kvcache_kernel,
        grid,
        key.device,
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        num_tokens,
        k_cache.shape[1],
        slot_mapping.stride(0),
        *key.stride(),
        *value.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        **consts,
    )
