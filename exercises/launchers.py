"""The capstone's launchers (given: read them, do not change them): check the arguments, size the
grid and the tiles, launch a kernel of ``exercises/stage7_capstone.py``.

Each takes the kernel to run as ``kernel=``: ``block_scores(q, k_cache, 1, 0, kernel=block_scores_kernel)``.
``out`` gets a guard row after it, watched when interpreted: a kernel that stores past the end
of ``out`` is told so.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
from torch import Tensor

from minipaged.kernels._checks import check_decode
from minipaged.kernels.interpreter import interpreting, launch


def _tiles(k_cache: torch.Tensor) -> dict:
    """The kernels' sizes: ``block_size, num_kv_heads, head_dim`` and their power-of-two tiles."""
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    return dict(
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        BLOCK=triton.next_power_of_2(block_size),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
    )


Kernel = Any  # a @triton.jit function (Triton ships no types)
Shape = tuple[int, ...] | torch.Size
_OUT = object()  # marks where ``out`` goes among a kernel's arguments


def _run(
    kernel: Kernel, grid: tuple[int, ...], out_shape: Shape, out_dtype: torch.dtype, *args: object, k_cache: Tensor
) -> Tensor:
    """Allocate ``out`` with a guard row after it, pass it where ``_OUT`` stands in ``args``, launch
    ``kernel`` with the cache's sizes, and (interpreted) say so if the kernel wrote into the guard."""
    sizes = _tiles(k_cache)
    numel = int(torch.Size(out_shape).numel())
    guard = max(sizes["BLOCK"], sizes["HEAD_DIM_PAD"])  # the farthest an unmasked lane reaches
    buffer = torch.full((numel + guard,), float("nan"), dtype=out_dtype, device=k_cache.device)
    out = buffer[:numel].view(out_shape)
    launch(kernel, grid, k_cache.device, *[out if a is _OUT else a for a in args], **sizes)
    if interpreting(k_cache.device) and not bool(buffer[numel:].isnan().all()):
        raise RuntimeError(
            f"{kernel.__name__} stored past the end of out: mask every store "
            "(the lanes d >= head_dim and t >= block_size are not part of out)"
        )
    return out


def _check_caches(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_head: int | None = None) -> None:
    if (
        k_cache.dim() != 4
        or k_cache.shape != v_cache.shape
        or not (k_cache.is_contiguous() and v_cache.is_contiguous())
    ):
        raise ValueError(
            "k_cache and v_cache must be contiguous [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if q.shape[-1] != k_cache.shape[3]:
        raise ValueError(f"q has head_dim {q.shape[-1]}, the cache {k_cache.shape[3]}")
    if kv_head is not None and not 0 <= kv_head < k_cache.shape[2]:
        raise ValueError(f"kv_head must be in [0, {k_cache.shape[2]}), got {kv_head}")


def _scale(scale: float | None, head_dim: int) -> float:
    return head_dim**-0.5 if scale is None else float(scale)


def _one_sequence(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, context_len: int) -> None:
    """A puzzle on one sequence is a decode of a batch of one: the package's decode checks apply."""
    lens = torch.tensor([context_len], dtype=torch.int32, device=q.device)
    heads = q.reshape(1, -1, q.shape[-1])
    if heads.shape[1] == 1:  # puzzles 3-4 take one query head: checked as one per KV head
        heads = heads.expand(1, k_cache.shape[2], q.shape[-1])
    check_decode(heads, k_cache, v_cache, block_table[None], lens)


def block_scores(
    q: Tensor,
    k_cache: Tensor,
    block_id: int,
    kv_head: int,
    scale: float | None = None,
    *,
    kernel: Kernel,
) -> Tensor:
    """Puzzle 1: q ``[head_dim]`` against block ``block_id`` of k_cache -> fp32 ``[block_size]`` scores."""
    _check_caches(q, k_cache, k_cache, kv_head)
    if q.dim() != 1 or not 0 <= block_id < k_cache.shape[0]:
        raise ValueError(f"q must be [head_dim] and block_id in [0, {k_cache.shape[0]}): {tuple(q.shape)}, {block_id}")
    args = (q, k_cache, _OUT, block_id, kv_head, _scale(scale, q.shape[0]))
    return _run(kernel, (1,), (k_cache.shape[1],), torch.float32, *args, k_cache=k_cache)


def tail_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_id: int,
    n: int,
    kv_head: int,
    scale: float | None = None,
    *,
    kernel: Kernel,
) -> Tensor:
    """Puzzle 2: q ``[head_dim]`` attends to slots ``0 .. n - 1`` of block ``block_id`` -> fp32 ``[head_dim]``."""
    _check_caches(q, k_cache, v_cache, kv_head)
    if q.dim() != 1 or not 0 <= block_id < k_cache.shape[0] or not 1 <= n <= k_cache.shape[1]:
        raise ValueError(f"want q [head_dim], block_id < {k_cache.shape[0]}, 1 <= n <= block_size; got {block_id}, {n}")
    args = (q, k_cache, v_cache, _OUT, block_id, n, kv_head, _scale(scale, q.shape[0]))
    return _run(kernel, (1,), q.shape, torch.float32, *args, k_cache=k_cache)


def online_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    context_len: int,
    kv_head: int,
    scale: float | None = None,
    *,
    kernel: Kernel,
) -> Tensor:
    """Puzzle 3: q ``[head_dim]`` attends to ``context_len`` tokens kept in blocks 0, 1, ... -> fp32 ``[head_dim]``."""
    _check_caches(q, k_cache, v_cache, kv_head)
    in_order = torch.arange(k_cache.shape[0], dtype=torch.int32, device=q.device)
    _one_sequence(q, k_cache, v_cache, in_order, context_len)
    args = (q, k_cache, v_cache, _OUT, context_len, kv_head, _scale(scale, q.shape[0]))
    return _run(kernel, (1,), q.shape, torch.float32, *args, k_cache=k_cache)


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    context_len: int,
    kv_head: int,
    scale: float | None = None,
    *,
    kernel: Kernel,
) -> Tensor:
    """Puzzle 4: q ``[head_dim]`` attends to one sequence through its int32 ``block_table`` -> fp32 ``[head_dim]``."""
    _check_caches(q, k_cache, v_cache, kv_head)
    _one_sequence(q, k_cache, v_cache, block_table, context_len)
    args = (q, k_cache, v_cache, _OUT, block_table, context_len, kv_head, _scale(scale, q.shape[0]))
    return _run(kernel, (1,), q.shape, torch.float32, *args, k_cache=k_cache)


def gqa_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    context_len: int,
    scale: float | None = None,
    *,
    kernel: Kernel,
) -> Tensor:
    """Puzzle 5: q ``[num_heads, head_dim]``, one sequence -> fp32 ``[num_heads, head_dim]``."""
    _check_caches(q, k_cache, v_cache)
    _one_sequence(q, k_cache, v_cache, block_table, context_len)
    q = q.contiguous()
    group = q.shape[0] // k_cache.shape[2]
    args = (q, k_cache, v_cache, _OUT, block_table, context_len, group, _scale(scale, q.shape[1]))
    return _run(kernel, (q.shape[0],), q.shape, torch.float32, *args, k_cache=k_cache)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    kernel: Kernel,
) -> torch.Tensor:
    """Puzzle 6 at work: one new query token per sequence. q: [num_seqs, num_heads, head_dim] -> same shape, q's dtype.

    k_cache, v_cache: contiguous [num_blocks, block_size, num_kv_heads, head_dim]; block_tables:
    int32 [num_seqs, max_blocks]; context_lens: int32 [num_seqs] (>= 1, the new token included).
    The signature of ``minipaged.kernels.paged_decode_attention`` (with ``kernel=``).
    """
    check_decode(q, k_cache, v_cache, block_tables, context_lens)
    _check_caches(q, k_cache, v_cache)
    num_seqs, num_heads, head_dim = q.shape
    if num_seqs == 0:
        return torch.empty_like(q)
    q, block_tables = q.contiguous(), block_tables.contiguous()
    group = num_heads // k_cache.shape[2]
    args: tuple[object, ...] = (q, k_cache, v_cache, _OUT, block_tables, context_lens, _scale(scale, head_dim))
    args += (block_tables.shape[1], num_heads, group)
    return _run(kernel, (num_seqs, num_heads), q.shape, q.dtype, *args, k_cache=k_cache)


def paged_prefill_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    context_len: int,
    scale: float | None = None,
    *,
    kernel: Kernel,
) -> Tensor:
    """Puzzle 7: q ``[q_len, num_heads, head_dim]``, the last ``q_len`` of ``context_len`` tokens of
    one sequence, attends causally through its int32 ``block_table`` -> q's shape and dtype."""
    _check_caches(q, k_cache, v_cache)
    if q.dim() != 3 or not 1 <= q.shape[0] <= context_len:
        raise ValueError(f"q must be [q_len, num_heads, head_dim] with 1 <= q_len <= context_len, got {tuple(q.shape)}")
    _one_sequence(q[-1], k_cache, v_cache, block_table, context_len)  # the last token sees it all
    q = q.contiguous()
    q_len, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[2]
    args = (q, k_cache, v_cache, _OUT, block_table, context_len, q_len, _scale(scale, head_dim), num_heads, group)
    return _run(kernel, (q_len, num_heads), q.shape, q.dtype, *args, k_cache=k_cache)
