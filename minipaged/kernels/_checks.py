"""Host-side argument checks of the kernel wrappers, with errors that say what to pass instead.

A kernel trusts its pointers: a wrong shape or dtype gives garbage, and under the interpreter
(which has no bounds checks) a bad block id, length or slot reads or writes outside the cache
and corrupts the process. So each wrapper checks shapes, dtypes and devices first; the checks
that read tensor *values* (a host sync) run only for interpreted launches, where that memory is
the process's own.
"""

from __future__ import annotations

import torch

from minipaged.kernels.interpreter import interpreting
from minipaged.utils import cdiv

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _same_device(**tensors: torch.Tensor) -> None:
    """Every tensor on the device of the first one."""
    anchor, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device}, {anchor} on {first.device}: use one device")


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )


def _check_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    """What decode and prefill share: q against the cache, the tables, the lengths, one device."""
    if q.dim() != 3:
        raise ValueError(f"q must be [tokens, num_heads, head_dim], got shape {tuple(q.shape)}")
    _check_cache(k_cache, v_cache)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, cache_head_dim = k_cache.shape[2:]
    if cache_head_dim != head_dim:
        raise ValueError(f"q has head_dim {head_dim}, the cache {cache_head_dim}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if q.dtype not in FLOATS or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"q, k_cache and v_cache must share one of {FLOATS}, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2:
        raise ValueError(
            f"block_tables must be int32 [num_seqs, max_blocks], got {block_tables.dtype} {tuple(block_tables.shape)}"
        )
    num_seqs = block_tables.shape[0]
    if context_lens.dtype != torch.int32 or tuple(context_lens.shape) != (num_seqs,):
        raise ValueError(
            f"context_lens must be int32 [num_seqs={num_seqs}], got {context_lens.dtype} {tuple(context_lens.shape)}"
        )
    _same_device(context_lens=context_lens, q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables)


def _check_attention_values(
    k_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, q_lens: torch.Tensor
) -> None:
    """Lengths within the tables, block ids within the cache (reads values: interpreted launches only)."""
    num_blocks, block_size = k_cache.shape[:2]
    ctx = context_lens.long()
    if bool((ctx < q_lens).any()):
        i = int(torch.nonzero(ctx < q_lens)[0])
        raise ValueError(f"sequence {i}: context_len {int(ctx[i])} < its {int(q_lens[i])} new query tokens")
    capacity = block_tables.shape[1] * block_size
    if bool((ctx > capacity).any()):
        raise ValueError(f"a context_len ({int(ctx.max())}) exceeds the block table capacity ({capacity} tokens)")
    used = torch.arange(block_tables.shape[1], device=ctx.device)[None, :] < cdiv(ctx, block_size)[:, None]
    ids = block_tables[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise ValueError(f"block_tables holds ids outside [0, {num_blocks}) in the blocks a sequence reads")


def check_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    """The arguments of :func:`~minipaged.kernels.paged_attention.paged_decode_attention`."""
    _check_attention(q, k_cache, v_cache, block_tables, context_lens)
    if q.shape[0] != block_tables.shape[0]:
        raise ValueError(f"decode takes one query per sequence: q has {q.shape[0]} rows, {block_tables.shape[0]} seqs")
    if interpreting(q.device):
        _check_attention_values(k_cache, block_tables, context_lens, torch.ones_like(context_lens, dtype=torch.long))


def check_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    """The arguments of :func:`~minipaged.kernels.paged_attention.paged_prefill_attention`."""
    _check_attention(q, k_cache, v_cache, block_tables, context_lens)
    num_seqs = block_tables.shape[0]
    if cu_seqlens_q.dtype != torch.int32 or tuple(cu_seqlens_q.shape) != (num_seqs + 1,):
        raise ValueError(
            f"cu_seqlens_q must be int32 [num_seqs + 1 = {num_seqs + 1}], "
            f"got {cu_seqlens_q.dtype} {tuple(cu_seqlens_q.shape)}"
        )
    if cu_seqlens_q.device != q.device:
        raise ValueError(f"cu_seqlens_q is on {cu_seqlens_q.device}, q on {q.device}")
    if interpreting(q.device):
        bounds = cu_seqlens_q.tolist()
        if bounds[0] != 0 or bounds[-1] != q.shape[0] or bounds != sorted(bounds):
            raise ValueError(f"cu_seqlens_q must rise from 0 to q.shape[0] = {q.shape[0]}, got {bounds}")
        _check_attention_values(k_cache, block_tables, context_lens, cu_seqlens_q.diff().long())


def check_store(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """The arguments of :func:`~minipaged.kernels.store.store_kvcache`."""
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(
            "key and value must both be [num_tokens, num_kv_heads, head_dim], "
            f"got {tuple(key.shape)}, {tuple(value.shape)}"
        )
    _check_cache(k_cache, v_cache)
    num_tokens, num_kv_heads, head_dim = key.shape
    if tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"key has (num_kv_heads, head_dim) = {(num_kv_heads, head_dim)}, the cache {tuple(k_cache.shape[2:])}"
        )
    if slot_mapping.dtype not in (torch.int64, torch.int32) or tuple(slot_mapping.shape) != (num_tokens,):
        raise ValueError(
            f"slot_mapping must be int64 [num_tokens={num_tokens}], "
            f"got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    _same_device(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if num_tokens and interpreting(key.device):  # a bad slot would write outside the cache
        num_slots = k_cache.shape[0] * k_cache.shape[1]
        live = slot_mapping[slot_mapping != -1]
        if live.numel() and (int(live.min()) < 0 or int(live.max()) >= num_slots):
            raise ValueError(f"slot_mapping holds slots outside [0, {num_slots}) other than -1")
