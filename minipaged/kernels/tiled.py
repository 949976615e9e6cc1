"""The Triton kernel's algorithm in plain PyTorch, one tile at a time (read it before the kernel).

:mod:`minipaged.kernels.paged_attention` splits paged attention into programs. One program owns
one KV head of one sequence and a tile of ``block_q`` query tokens (times the query heads that
share the KV head). It walks the sequence's context ``block_n`` key positions at a time, finds
each position through the block table (``block_table[pos // block_size]``, offset ``pos %
block_size``), and never holds a whole row of scores: it keeps an **online softmax** per query
row — the running max ``m``, the running sum ``l`` of ``exp(s - m)`` and the output accumulator
``acc = sum exp(s - m) * v`` — and rescales ``l`` and ``acc`` by ``alpha = exp(m_old - m_new)``
whenever a tile raises the max. At the end ``acc / l`` is ``softmax(scores) @ v``.

This module does the same with Python loops where the kernel has programs and its KV loop, so
every piece can be printed, drawn (:mod:`minipaged.viz.kernel`) and tested:

- :func:`query_tile` and :func:`tile_kv_end`: the queries a program owns, where its walk stops;
- :func:`kv_tiles` and :func:`program_reads`: the positions, and the logical and physical
  blocks, each loop step reads;
- :class:`OnlineSoftmax`: the running state, folded one tile of scores at a time;
  :func:`online_softmax_trace` records it after every tile for one row of scores;
- :func:`tiled_attention`: one sequence's output computed program by program, tile by tile;
  equal to :func:`minipaged.attention.reference.causal_attention` over the gathered K/V;
- :func:`kernel_tile_sizes`: the ``(block_q, block_n)`` a Triton launch would pick.

The kernel works in base 2 (``exp2``, with ``log2(e)`` folded into the scale); this module uses
``exp``, which gives the same numbers. Its tile sizes come from the kernel module
(:func:`kernel_tile_sizes`), so importing it loads Triton; the torch path never imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from minipaged.kernels.paged_attention import kernel_constexprs
from minipaged.utils import cdiv

# The kernel starts the running max at a large negative number, not -inf: a row that sees no key
# in a tile then gets exp(-inf - m) = 0, never exp(-inf + inf) = NaN.
M_START = -1.0e30


def query_tile(q_len: int, q_tile: int, block_q: int) -> range:
    """The query tokens (0-based among the sequence's ``q_len`` new ones) that tile ``q_tile`` owns.

    Empty for a tile at or past ``q_len``: the grid is sized by the longest sequence of the batch,
    and such a program returns at once.
    """
    start = q_tile * block_q
    return range(min(start, q_len), min(start + block_q, q_len))


def tile_kv_end(context_len: int, q_len: int, q_tile: int, block_q: int) -> int:
    """One past the last key position tile ``q_tile``'s queries can see, where its KV walk stops.

    Query ``i`` sits at position ``context_len - q_len + i`` and sees keys up to it; the tile's
    last query is ``min((q_tile + 1) * block_q, q_len) - 1``.
    """
    return min(context_len, context_len - q_len + (q_tile + 1) * block_q)


def kv_tiles(kv_end: int, block_n: int) -> list[range]:
    """The key positions each step of the KV loop reads: ``0 .. block_n - 1``, then the next
    ``block_n``, ..., the last tile cut at ``kv_end``."""
    if block_n < 1:
        raise ValueError(f"block_n must be >= 1, got {block_n}")
    return [range(start, min(start + block_n, kv_end)) for start in range(0, kv_end, block_n)]


class BlockRead(NamedTuple):
    """One block a loop step touches: its place in the sequence, its id in the pool, how many of its slots."""

    logical: int
    physical: int
    num_positions: int


def program_reads(
    block_table: Sequence[int], context_len: int, block_size: int, block_n: int, kv_end: int | None = None
) -> list[list[BlockRead]]:
    """For each step of one program's KV loop, the blocks it reads, in order.

    ``block_table``: the sequence's physical block ids in logical order; ``kv_end`` (default
    ``context_len``) is where the walk stops (:func:`tile_kv_end` for a prefill query tile).
    Position ``pos`` lives in physical block ``block_table[pos // block_size]``, so a step of
    ``block_n`` positions may span several small blocks, or part of a big one.
    """
    kv_end = context_len if kv_end is None else kv_end
    if not 0 <= kv_end <= context_len:
        raise ValueError(f"kv_end ({kv_end}) must be in [0, context_len={context_len}]")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if cdiv(context_len, block_size) > len(block_table):
        raise ValueError(
            f"{context_len} tokens need {cdiv(context_len, block_size)} blocks of {block_size}, "
            f"the block table has {len(block_table)}: pass the sequence's whole table"
        )
    steps = []
    for tile in kv_tiles(kv_end, block_n):
        reads = []
        for logical in range(tile.start // block_size, (tile.stop - 1) // block_size + 1):
            lo, hi = max(tile.start, logical * block_size), min(tile.stop, (logical + 1) * block_size)
            reads.append(BlockRead(logical, int(block_table[logical]), hi - lo))
        steps.append(reads)
    return steps


@dataclass
class OnlineSoftmax:
    """The running softmax of ``rows`` query rows, one tile of keys at a time.

    ``m``: [rows] the largest score seen; ``l``: [rows] the sum of ``exp(s - m)`` over the scores
    seen; ``acc``: [rows, head_dim] the sum of ``exp(s - m) * v``, not yet divided by ``l``.
    """

    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 - the kernel's (and FlashAttention's) name
    acc: torch.Tensor

    @classmethod
    def start(
        cls, rows: int, head_dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> OnlineSoftmax:
        """The state before any key: ``m = M_START``, ``l = 0``, ``acc = 0``."""
        return cls(
            torch.full((rows,), M_START, dtype=dtype, device=device),
            torch.zeros(rows, dtype=dtype, device=device),
            torch.zeros(rows, head_dim, dtype=dtype, device=device),
        )

    def update(self, scores: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Fold in one tile. scores: [rows, n] (``-inf`` where a key is not visible); v: [n, head_dim].

        Returns ``alpha`` [rows]: the factor the old ``l`` and ``acc`` were multiplied by because
        the max rose from ``m_old`` to ``m_new`` (1 where it did not, 0 on a row's first keys).
        """
        m_new = torch.maximum(self.m, scores.max(dim=1).values)
        alpha = torch.exp(self.m - m_new)
        p = torch.exp(scores - m_new[:, None])
        self.l = self.l * alpha + p.sum(dim=1)
        self.acc = self.acc * alpha[:, None] + p @ v
        self.m = m_new
        return alpha

    def output(self) -> torch.Tensor:
        """``acc / l`` [rows, head_dim]: the softmax-weighted values (0 for a row that saw no key)."""
        return self.acc / torch.where(self.l > 0, self.l, 1.0)[:, None]


def online_softmax_trace(scores: Sequence[float] | torch.Tensor, block_n: int) -> dict[str, torch.Tensor]:
    """The online softmax of one row of ``scores`` in tiles of ``block_n``, recorded after each tile (float64).

    Returns ``m`` and ``l`` after each tile, the ``alpha`` each tile applied to the old sum, the
    final probabilities ``exp(s - m) / l`` (``p_online``) and ``torch.softmax`` of the row
    (``p_full``): the two agree to rounding.
    """
    s = torch.as_tensor(scores, dtype=torch.float64).reshape(1, -1)
    if s.numel() == 0:
        raise ValueError("scores must not be empty")
    state = OnlineSoftmax.start(1, 1, torch.float64)
    ms, ls, alphas = [], [], []
    for tile in kv_tiles(s.shape[1], block_n):
        alpha = state.update(s[:, tile.start : tile.stop], torch.zeros(len(tile), 1, dtype=torch.float64))
        ms.append(state.m[0])
        ls.append(state.l[0])
        alphas.append(alpha[0])
    return dict(
        m=torch.stack(ms),
        l=torch.stack(ls),
        alpha=torch.stack(alphas),
        p_online=torch.exp(s[0] - state.m[0]) / state.l[0],
        p_full=torch.softmax(s[0], dim=0),
    )


def tiled_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: Sequence[int] | torch.Tensor,
    context_len: int,
    block_q: int,
    block_n: int,
    scale: float | None = None,
) -> torch.Tensor:
    """One sequence's paged attention, computed the way the kernel's programs do, one after another.

    q: [q_len, num_heads, head_dim], the sequence's new queries; k_cache, v_cache: [num_blocks,
    block_size, num_kv_heads, head_dim]; block_table: the sequence's physical block ids (at least
    ``cdiv(context_len, block_size)``); context_len: its cached tokens, the new ones included.
    Returns [q_len, num_heads, head_dim] in q's dtype (fp32 inside, as in the kernel).

    The loops are the kernel's grid: a KV head (``program_id(1)``), a query tile
    (``program_id(2)``), then the KV loop over :func:`kv_tiles` up to :func:`tile_kv_end`. A
    program's rows are its ``block_q`` tokens times the query heads of its KV head (GQA).
    """
    q_len, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if context_len < q_len:
        raise ValueError(f"context_len ({context_len}) must be >= q_len ({q_len})")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if block_q < 1:
        raise ValueError(f"block_q must be >= 1, got {block_q}")
    table = torch.as_tensor(block_table, dtype=torch.long, device=q.device)
    if cdiv(context_len, block_size) > table.numel():
        raise ValueError(
            f"{context_len} tokens need {cdiv(context_len, block_size)} blocks, the table has {table.numel()}"
        )
    group = num_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.zeros(q_len, num_heads, head_dim, dtype=torch.float32, device=q.device)
    for kv_head in range(num_kv_heads):
        heads = slice(kv_head * group, (kv_head + 1) * group)
        for q_tile in range(cdiv(q_len, block_q)):
            tokens = query_tile(q_len, q_tile, block_q)
            rows = q[tokens.start : tokens.stop, heads].float().reshape(-1, head_dim)  # row = (token, head)
            q_pos = torch.arange(tokens.start, tokens.stop, device=q.device) + context_len - q_len
            q_pos = q_pos.repeat_interleave(group)
            state = OnlineSoftmax.start(rows.shape[0], head_dim, device=q.device)
            for tile in kv_tiles(tile_kv_end(context_len, q_len, q_tile, block_q), block_n):
                pos = torch.arange(tile.start, tile.stop, device=q.device)
                blocks, offsets = table[pos // block_size], pos % block_size  # through the block table
                k = k_cache[blocks, offsets, kv_head].float()  # [n, head_dim]
                v = v_cache[blocks, offsets, kv_head].float()
                s = (rows @ k.T) * scale
                state.update(s.masked_fill(pos[None, :] > q_pos[:, None], float("-inf")), v)
            out[tokens.start : tokens.stop, heads] = state.output().reshape(len(tokens), group, head_dim)
    return out.to(q.dtype)


def kernel_tile_sizes(
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_q_len: int,
    decode: bool,
    block_m: int | None = None,
    block_n: int | None = None,
    **mode: bool,
) -> tuple[int, int]:
    """``(block_q, block_n)``: the query tokens per program and key positions per loop step that
    the Triton kernel would use for this launch (``kernel_constexprs``'s ``BLOCK_Q`` and
    ``BLOCK_N``; ``mode`` goes to it as well, e.g. ``interpret=False`` for a GPU).
    """
    consts = kernel_constexprs(dtype, num_heads, num_kv_heads, head_dim, max_q_len, decode, block_m, block_n, **mode)
    return consts["BLOCK_Q"], consts["BLOCK_N"]
