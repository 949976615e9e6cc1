"""Stage 4 exercises (notebook 04_triton_kernel). Check: ``python -m exercises stage4``.

Write them without looking at ``minipaged/kernels/``. Replace each ``raise NotImplementedError``
with your code; keep the names and signatures.

The first is a real Triton kernel, the write of new K/V into the paged cache. The checks run it
in Triton's interpreter on CPU tensors (no GPU needed; on CUDA tensors it runs compiled). The
other three are the attention kernel's ideas in plain torch and arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from minipaged.kernels.interpreter import launch  # compiled on a GPU, interpreted for CPU tensors


@triton.jit
def store_kvcache_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations: only constexprs have one
    key, value, k_cache, v_cache, slot_mapping, key_stride, value_stride, D, D_PAD: tl.constexpr
):
    """Program ``t`` copies token ``t``'s new K and V into its slot of the paged cache.

    :func:`store_kvcache` below launches one program per token (grid ``(num_tokens,)``); read it.

    - key, value: token ``t``'s row starts at ``key + t * key_stride`` and holds
      ``D = num_kv_heads * head_dim`` numbers (head 0's, then head 1's, ...);
    - k_cache, v_cache: contiguous ``[num_blocks, block_size, num_kv_heads, head_dim]``, so the
      row of slot ``s = block_id * block_size + offset`` starts at ``k_cache + s * D``;
    - slot_mapping: int64 ``[num_tokens]``; -1 marks a padding token, which writes nothing;
    - D_PAD: the power of two >= D (``tl.arange`` wants one).

    To do: load this program's slot; if it is -1, return. Otherwise load the ``D`` numbers of
    the key row and store them at the slot's row of ``k_cache``; the same for value. Mask the
    lanes ``D .. D_PAD - 1``: unmasked, they would write into the next slot, or outside the cache
    (the interpreter has no bounds checks: that corrupts memory).

    Triton: ``tl.program_id(0)``, ``tl.arange(0, D_PAD)``, ``tl.load(ptr + offsets, mask=...)``,
    ``tl.store(ptr + offsets, values, mask=...)``; ``if slot < 0: return`` works. In the
    interpreter the kernel runs as Python, so ``print(slot)`` shows values.
    """
    raise NotImplementedError


def store_kvcache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    kernel: Any = store_kvcache_kernel,  # a @triton.jit function (Triton ships no types)
) -> None:
    """Your kernel at work (given, do not change): new K/V into the paged cache, in place; slot -1 writes nothing.

    key, value: ``[num_tokens, num_kv_heads, head_dim]``, each token's heads contiguous (a slice of
    a packed QKV projection is fine); k_cache, v_cache: contiguous ``[num_blocks, block_size,
    num_kv_heads, head_dim]`` of key's dtype; slot_mapping: int64 ``[num_tokens]``. The contract
    of ``minipaged.attention.reference.store_kvcache``, which the checks compare you with.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape or k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != tuple(key.shape[1:]):
        raise ValueError(
            f"shapes do not fit: key {tuple(key.shape)}, value {tuple(value.shape)}, "
            f"caches {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if {key.dtype, value.dtype} != {k_cache.dtype} or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"convert first, e.g. key.to(k_cache.dtype): got {key.dtype}, {value.dtype}, {k_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the caches must be contiguous")
    if any(t.stride(2) != 1 or (num_kv_heads > 1 and t.stride(1) != head_dim) for t in (key, value)):
        raise ValueError("each token's heads must be contiguous: pass key.contiguous()")
    if slot_mapping.dtype != torch.int64 or tuple(slot_mapping.shape) != (num_tokens,):
        raise ValueError(
            f"slot_mapping must be int64 [{num_tokens}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    if num_tokens == 0:
        return
    D = num_kv_heads * head_dim
    launch(
        kernel,
        (num_tokens,),
        key.device,
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        value.stride(0),
        D,
        D_PAD=triton.next_power_of_2(D),
    )


def online_softmax_update(
    m: torch.Tensor,
    l: torch.Tensor,  # noqa: E741  (the running sum's name in the flash-attention papers)
    acc: torch.Tensor,
    scores: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one KV tile into the online-softmax state of a block of query rows; return the new ``(m, l, acc)``.

    m: ``[rows]`` running max of the scores seen so far; l: ``[rows]`` running sum of
    ``exp(score - m)``; acc: ``[rows, head_dim]`` running, un-normalised ``sum(exp(score - m) * v)``;
    scores: ``[rows, n]`` this tile's scores (already scaled, natural-exp scale, ``-inf`` where a
    key is masked); v: ``[n, head_dim]`` this tile's values. All fp32.

    The state starts at ``m = -1e30`` (finite, as in the kernel), ``l = 0``, ``acc = 0``. After the
    last tile, ``acc / l[:, None]`` must equal ``softmax(all scores) @ all v``. A row whose tile is
    entirely ``-inf`` must not produce NaN and must leave that row's state unchanged.

    Hint: ``m_new = max(m, rowmax(scores))``; everything accumulated so far was scaled by
    ``exp(-m)``, so rescale it by ``alpha = exp(m - m_new)`` before adding this tile's
    ``p = exp(scores - m_new)``.
    """
    raise NotImplementedError


def tile_kv_end(context_len: int, q_len: int, q_tile: int, block_q: int) -> int:
    """One past the last key position that query tile ``q_tile`` may see: where the kernel's walk stops.

    A sequence has ``context_len`` tokens in all, the last ``q_len`` of them new queries; query ``i``
    sits at position ``context_len - q_len + i`` and sees keys ``0 ..`` that position. Tile ``q_tile``
    holds queries ``q_tile * block_q .. q_tile * block_q + block_q - 1`` (those below ``q_len``;
    assume ``q_tile * block_q < q_len``).

    Examples: a decode (``q_len = 1``, ``block_q = 1``) sees the whole context: ``context_len``.
    A 100-token prompt (``context_len = q_len = 100``) in tiles of 16: tile 0 -> 16, tile 6 -> 100.
    """
    raise NotImplementedError


def count_loop_steps(
    q_lens: Sequence[int], context_lens: Sequence[int], num_kv_heads: int, block_q: int, block_n: int
) -> int:
    """Total KV-tile loop iterations of one prefill launch, over all its programs.

    The grid is ``(num_seqs, num_kv_heads, cdiv(max(q_lens), block_q))``. Program ``(s, h, t)``
    returns at once if its tile has no query (``t * block_q >= q_lens[s]``); otherwise it walks
    keys ``0 .. tile_kv_end(...) - 1`` in steps of ``block_n``: ``cdiv(kv_end, block_n)`` iterations.
    Under Triton's interpreter each iteration of each program costs about the same, whatever the
    tile size: this number is its cost model.

    Example: a decode of one 256-token sequence with 2 KV heads (``q_lens=[1]``, ``block_q=1``):
    32 iterations with ``block_n=16``, 2 with ``block_n=256``.
    """
    raise NotImplementedError
