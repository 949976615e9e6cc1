"""Stage 7, the capstone (after notebook 04_triton_kernel): the paged decode attention kernel, in six puzzles.

Check: ``python -m exercises stage7`` (or ``capstone``). Write them without looking at
``minipaged/kernels/``. Each puzzle is a Triton kernel: replace its ``raise NotImplementedError``
with the kernel's body; keep the names and signatures. Each kernel is the one before it plus one
idea, so start each from your previous one. The launchers at the bottom of this file are given:
read them, do not change them. The checks run your kernels in Triton's interpreter on CPU tensors
(no GPU needed), so ``print(j, block)`` inside a kernel shows values, once per program.

1. ``block_scores_kernel``: the scores of one query against one block of keys;
2. ``tail_attention_kernel``: attention over a block that is only partly filled (mask the tail);
3. ``online_attention_kernel``: attention over many blocks, one per loop step (online softmax);
4. ``paged_attention_kernel``: the same walk, each block found through the block table;
5. ``gqa_attention_kernel``: every query head, each reading its KV head (grouped-query attention);
6. ``paged_decode_kernel``: the whole decode kernel, a batch of sequences; its launcher
   :func:`paged_decode_attention` has the signature of ``minipaged.kernels.paged_decode_attention``,
   so the engine can run your kernel as its decode attention.

What they all share:

- The caches are contiguous ``[num_blocks, block_size, num_kv_heads, head_dim]``. Number ``d`` of
  KV head ``h`` in slot ``t`` of block ``b`` sits at
  ``k_cache + ((b * block_size + t) * num_kv_heads + h) * head_dim + d``: ``b * block_size + t``
  is stage 3's slot. Cast block ids to ``tl.int64`` before multiplying (a big cache holds more
  than 2**31 numbers).
- ``tl.arange`` wants powers of two: ``BLOCK`` is the power of two >= ``block_size`` and
  ``HEAD_DIM_PAD`` the one >= ``head_dim``. Mask the lanes past ``block_size`` and ``head_dim``
  on every load and store:
  unmasked, a load reads the next slot (or outside the cache) and a store writes there (the
  interpreter has no bounds checks: that corrupts memory; the launchers watch one guard row
  past ``out``, the checks a guard block on each side of the caches).
- ``.to(tl.float32)`` right after each load: the interpreter's fp16/bf16 arithmetic is wrong,
  and ``tl.exp`` wants fp32.
- The tile picture is ``minipaged.kernels.tiled.tiled_attention`` with ``block_q = 1``,
  ``block_n = block_size`` and one query head per program: a program holds one query vector
  ``[HEAD_DIM_PAD]`` and, at each loop step, one block's keys and values as ``[BLOCK,
  HEAD_DIM_PAD]`` tiles. Without ``tl.dot`` a
  score is ``tl.sum(k * q[None, :], axis=1)``.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from minipaged.kernels._checks import check_decode
from minipaged.kernels.interpreter import interpreting, launch


@triton.jit
def block_scores_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations: only constexprs have one
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
    """Puzzle 1, one block's scores: ``out[t] = scale * (q . k_cache[block_id, t, kv_head])``.

    One program (grid ``(1,)``). q: ``[head_dim]``, one query head; out: fp32 ``[block_size]``,
    one score per slot ``t`` of block ``block_id``.

    To do: load q (lanes ``d < head_dim``); load the block's keys as a ``[BLOCK, HEAD_DIM_PAD]``
    tile (rows ``t < block_size``, columns ``d < head_dim``); multiply, sum each row, scale;
    store the ``block_size`` scores.

    Hint: ``t = tl.arange(0, BLOCK)``, ``d = tl.arange(0, HEAD_DIM_PAD)``; a 2-D tile of pointers
    is ``rows[:, None] + d[None, :]``, its mask ``t_ok[:, None] & d_ok[None, :]``; ``other=0.0``
    gives masked lanes a value. ``block_id.to(tl.int64)`` before multiplying.
    """
    raise NotImplementedError


@triton.jit
def tail_attention_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations: only constexprs have one
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
    """Puzzle 2, masking the tail: attention of ``q`` over the first ``n`` slots of block ``block_id``.

    One program. q: ``[head_dim]``; out: fp32 ``[head_dim]`` =
    ``softmax(scores[:n]) @ v_cache[block_id, :n, kv_head]``, with puzzle 1's scores. This is the
    last block of a sequence: ``1 <= n <= block_size`` slots hold its tokens, the slots past them
    hold whatever was there before (another sequence's tokens, old ones): they must count for
    nothing.

    To do: puzzle 1's scores with ``t < n`` where it had ``t < block_size``; set the masked
    scores to ``-inf`` (then ``exp`` gives them 0), subtract the max, ``exp``, load the values
    tile the same way and store ``sum(p * v) / sum(p)``.

    Hint: ``tl.where(t_ok, s, float("-inf"))``, ``tl.max(s, axis=0)``, ``tl.exp``; ``p[:, None] * v``
    then ``tl.sum(..., axis=0)`` weighs the rows of ``v``.
    """
    raise NotImplementedError


@triton.jit
def online_attention_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations: only constexprs have one
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
    """Puzzle 3, online softmax across blocks: attention of ``q`` over a sequence of ``context_len`` tokens.

    One program. The sequence is stored in order: its token ``pos`` in slot ``pos % block_size``
    of block ``pos // block_size`` (blocks 0, 1, 2, ...). out: fp32 ``[head_dim]`` =
    ``softmax(q . K * scale) @ V`` over its ``context_len`` tokens.

    To do: loop over the blocks, ``for j in range(0, tl.cdiv(context_len, block_size))``; each step
    is puzzle 2 on block ``j``, its valid slots the positions ``j * block_size + t < context_len``.
    Never hold all the scores: keep the running max ``m``, the running sum ``l`` of ``exp(s - m)``
    and the accumulator ``acc = sum exp(s - m) * v``. When a block raises the max from ``m`` to
    ``m_new``, everything summed so far was scaled by ``exp(-m)``: multiply ``l`` and ``acc`` by
    ``alpha = exp(m - m_new)`` before adding the block's ``p = exp(s - m_new)``. Store ``acc / l``.

    Hint: start ``m = -1.0e30`` (finite: ``exp(m - m_new)`` is then 0 on the first step, never
    NaN), ``l = 0.0``, ``acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)``; update ``m`` last.
    Stage 4's ``online_softmax_update`` is the same step in torch;
    ``minipaged.viz.kernel.draw_online_softmax`` draws ``m`` and ``l`` block by block.
    """
    raise NotImplementedError


@triton.jit
def paged_attention_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations: only constexprs have one
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
    """Puzzle 4, reading through the block table: puzzle 3 on a sequence whose blocks lie anywhere in the pool.

    One program. block_table: int32 ``[max_blocks]``, the sequence's physical block ids in logical
    order (entries past ``cdiv(context_len, block_size)`` are padding: never read them). Token
    ``pos`` sits in slot ``pos % block_size`` of block ``block_table[pos // block_size]``.

    To do: puzzle 3, with loop step ``j`` reading physical block ``block_table[j]`` instead of
    block ``j``.

    Hint: ``tl.load(block_table + j)``.
    ``minipaged.kernels.tiled.program_reads(table, context_len, block_size, block_size)`` lists
    the blocks each step reads; ``minipaged.viz.kernel.draw_program_reads`` draws them.
    """
    raise NotImplementedError


@triton.jit
def gqa_attention_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations: only constexprs have one
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
    """Puzzle 5, grouped-query attention: every query head of one sequence, one program each.

    Grid ``(num_heads,)``. q, out: ``[num_heads, head_dim]`` (out fp32), contiguous. The
    ``num_heads`` query heads share ``num_kv_heads`` KV heads, ``group = num_heads //
    num_kv_heads`` query heads each: query head ``h`` reads KV head ``h // group`` (heads 0, 1
    of a group of 2 read KV head 0, heads 2, 3 read KV head 1). ``group = 1`` is plain
    multi-head attention, ``num_kv_heads = 1`` multi-query attention.

    To do: puzzle 4 for query head ``h = tl.program_id(0)``: its row of q, its KV head, its row of out.
    """
    raise NotImplementedError


@triton.jit
def paged_decode_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations: only constexprs have one
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
    """Puzzle 6, the whole decode kernel: one new token per sequence attends to its paged context.

    Grid ``(num_seqs, num_heads)``: program ``(s, h)`` is query head ``h`` of sequence ``s``.
    q, out: contiguous ``[num_seqs, num_heads, head_dim]``, out in q's dtype; block_tables: int32
    ``[num_seqs, max_blocks]``, contiguous (sequence ``s``'s table starts at ``block_tables + s *
    max_blocks``); context_lens: int32 ``[num_seqs]``, each >= 1 (the new token is already in the
    cache, at position ``context_len - 1``, and sees every position).

    To do: puzzle 5 for sequence ``s = tl.program_id(0)``: load its ``context_len``, walk its
    block table, read and write its rows of q and out. Store in out's dtype:
    ``.to(out.dtype.element_ty)``.

    Then :func:`paged_decode_attention` runs it with the engine's signature, and
    ``minipaged.attention.reference.paged_decode_attention`` is what the checks compare it with.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# The launchers (given, do not change): check the arguments, size the grid and the tiles, launch.


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
    kernel: Kernel = block_scores_kernel,
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
    kernel: Kernel = tail_attention_kernel,
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
    kernel: Kernel = online_attention_kernel,
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
    kernel: Kernel = paged_attention_kernel,
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
    kernel: Kernel = gqa_attention_kernel,
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
    kernel: Kernel = paged_decode_kernel,
) -> torch.Tensor:
    """Puzzle 6 at work: one new query token per sequence. q: [num_seqs, num_heads, head_dim] -> same shape, q's dtype.

    k_cache, v_cache: contiguous [num_blocks, block_size, num_kv_heads, head_dim]; block_tables:
    int32 [num_seqs, max_blocks]; context_lens: int32 [num_seqs] (>= 1, the new token included).
    The signature of ``minipaged.kernels.paged_decode_attention``.
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
