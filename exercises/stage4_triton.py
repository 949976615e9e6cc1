"""Stage 4 exercises (notebook 04_triton_kernel). Check: ``pytest tests/exercises -k stage4``.

Write them without looking at ``minipaged/kernels/paged_attention.py``. Replace each
``raise NotImplementedError`` with your code; keep the names and signatures. No Triton needed:
these are the kernel's ideas in plain torch and arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def online_softmax_update(
    m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor, v: torch.Tensor  # noqa: E741
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
