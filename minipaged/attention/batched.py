"""Paged attention for a whole batch at once, in plain PyTorch: the engine's default on a CPU.

:mod:`minipaged.attention.reference` loops over the sequences of a batch in Python, gathering
each one's K/V on its own. Here the whole batch goes through the same few tensor operations,
so the cost of a layer no longer grows with a Python loop over sequences:

1. **one gather** through the block tables, ``k_cache[block_tables]`` ->
   ``[num_seqs, max_blocks * block_size, num_kv_heads, head_dim]``: every sequence's context in
   logical order, padded to the longest one;
2. the packed queries laid out padded, ``[num_seqs, max_q_len, num_heads, head_dim]``;
3. **one mask** says which key each query sees: query ``i`` of a sequence with ``q_len`` new
   tokens and ``context_len`` cached ones sees keys ``j <= context_len - q_len + i`` (the
   reference's rule; the padding beyond ``context_len`` is never visible to a real query);
4. **one** attention call (query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``):
   ``F.scaled_dot_product_attention`` with ``enable_gqa`` for prefill; for decode the query
   heads sharing a KV head are laid out as the rows of one attention, written out as two
   matrix products and a softmax, in fp32;
5. the padded output is packed back.

Decode rows (``q_len == 1``) are kept apart from prefill rows: padded to a long prompt's
``q_len`` they would cost that many times their work. So a mixed step is two calls — one over
every decoding sequence, one over every prefilling one — never a loop over sequences. When the
lengths within a group differ a lot, it is split once more into short and long
(:func:`split_by_length`), so short sequences are not padded to the longest.

Which rows go where, and the masks, depend only on the step's lengths: :func:`plan_batch`
computes them once per step, and every layer reuses the :class:`BatchPlan`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from minipaged.attention import native_decode, reference
from minipaged.utils import cdiv

if TYPE_CHECKING:
    from minipaged.attention.metadata import PagedMetadata

__all__ = [
    "BatchPlan",
    "TorchBackend",
    "plan_batch",
    "store_kvcache",
    "paged_prefill_attention",
    "paged_decode_attention",
]


@dataclass
class RowGroup:
    """Sequences attended by one call.

        seqs: long [g] (indices into the batch); rows: long [tokens] (packed query rows, in order);
        flat: long [tokens] (where each row sits in the padded ``[g * max_q_len]`` layout);
        blocks: long [g * num_blocks] (the physical blocks to gather, table by table);
        tables: int32 [g, num_blocks] and context_lens: int32 [g], for a kernel that reads the
    blocks in place (:mod:`minipaged.attention.native_decode`);
        bias: float32 [g, 1, max_q_len, num_blocks * block_size], added to the scores: 0 where a key is
    visible, -inf where it is not (SDPA runs faster on this additive form than on a bool mask,
    20% for decode here, with identical results); ``all_rows``: the
        group is every row of the batch, one per sequence, in order (a pure decode step: no
        scatter needed).
    """

    seqs: torch.Tensor
    rows: torch.Tensor
    flat: torch.Tensor
    blocks: torch.Tensor
    tables: torch.Tensor
    context_lens: torch.Tensor
    bias: torch.Tensor
    max_q_len: int
    num_blocks: int
    all_rows: bool


@dataclass
class BatchPlan:
    """The row groups of one step: decode groups and prefill groups (one of each, or two when the
    lengths in a group differ much). ``one_token``: every sequence brings exactly one new token,
    a step a decode-only kernel could run on its own."""

    decode: list[RowGroup]
    prefill: list[RowGroup]
    one_token: bool


def _group(
    seqs: list[int],
    q_lens: Sequence[int],
    context_lens: Sequence[int],
    starts: Sequence[int],
    block_tables: torch.Tensor,
    block_size: int,
) -> RowGroup:
    device = block_tables.device
    if len(seqs) == len(q_lens) == sum(q_lens):  # a pure decode step: the common case, kept cheap
        ctx = torch.tensor(context_lens, dtype=torch.long, device=device)
        num_blocks, max_q = cdiv(max(context_lens), block_size), 1
        seq_ids = rows = flat = torch.arange(len(seqs), device=device)
        tables, all_rows = block_tables[:, :num_blocks], True
        hidden = (torch.arange(num_blocks * block_size, device=device)[None, :] >= ctx[:, None])[:, None, None, :]
    else:
        ql = torch.tensor([q_lens[s] for s in seqs], dtype=torch.long)
        ctx = torch.tensor([context_lens[s] for s in seqs], dtype=torch.long)
        first = torch.tensor([starts[s] for s in seqs], dtype=torch.long)
        max_q = int(ql.max())
        num_blocks = cdiv(int(ctx.max()), block_size)
        g = torch.repeat_interleave(torch.arange(len(seqs)), ql)  # group member of each packed row
        i = torch.arange(int(ql.sum())) - torch.repeat_interleave(torch.cumsum(ql, 0) - ql, ql)  # row within its seq
        rows, flat = (first[g] + i).to(device), (g * max_q + i).to(device)
        last_visible = (ctx - ql)[:, None] + torch.arange(max_q)[None, :]  # [g, max_q]
        hidden = (torch.arange(num_blocks * block_size)[None, None, :] > last_visible[:, :, None])[:, None].to(device)
        seq_ids = torch.tensor(seqs, dtype=torch.long, device=device)
        tables, all_rows = block_tables[seq_ids, :num_blocks], False
    return RowGroup(
        seqs=seq_ids,
        rows=rows,
        flat=flat,
        blocks=tables.long().flatten(),
        tables=tables.to(torch.int32),
        context_lens=ctx.to(device=device, dtype=torch.int32),
        # the additive mask: -inf where a key is hidden from a query, 0 where it is visible
        bias=torch.zeros(hidden.shape, device=device).masked_fill_(hidden, float("-inf")),
        max_q_len=max_q,
        num_blocks=num_blocks,
        all_rows=all_rows,
    )


def plan_batch(
    q_lens: Sequence[int],
    context_lens: Sequence[int],
    block_tables: torch.Tensor,
    block_size: int,
    in_place: bool = False,
) -> BatchPlan:
    """Split a step's sequences into a decode group (``q_len == 1``) and a prefill group
    (``q_len > 1``); sequences with no new token get no row. Host-side lengths, one call per step.
    ``in_place``: decode rows are read in place (no padding to split against), one group."""
    starts = [0]
    for n in q_lens[:-1]:
        starts.append(starts[-1] + n)
    decode = [s for s, n in enumerate(q_lens) if n == 1]
    prefill = [s for s, n in enumerate(q_lens) if n > 1]
    decode_parts = [decode] if in_place else split_by_length(decode, q_lens, context_lens, block_size, min_size=4)
    prefill_parts = split_by_length(prefill, q_lens, context_lens, block_size, min_size=2)
    return BatchPlan(
        [_group(p, q_lens, context_lens, starts, block_tables, block_size) for p in decode_parts if p],
        [_group(p, q_lens, context_lens, starts, block_tables, block_size) for p in prefill_parts if p],
        one_token=len(decode) == len(q_lens),
    )


def split_by_length(
    seqs: list[int], q_lens: Sequence[int], context_lens: Sequence[int], block_size: int, min_size: int = 4
) -> list[list[int]]:
    """One group, or two (short, long) when that computes at least 30% fewer padded scores.

    Every sequence of a group is padded to the group's longest ``q_len`` and context, so a group
    costs about ``len(group) x max q_len x max context``; a split must leave ``min_size``
    sequences on each side, since each call has a fixed cost too.
    """
    if len(seqs) < 2 * min_size:
        return [seqs]
    # No split can beat the padding-free cost, sum(q_len x blocks) >= n x min q_len x min blocks:
    # when even that is above 70% of the whole (a decode step of similar lengths), stop here.
    blocks_of = {s: cdiv(context_lens[s], block_size) for s in seqs}
    q_of = [q_lens[s] for s in seqs]
    if min(q_of) * min(blocks_of.values()) > 0.7 * max(q_of) * max(blocks_of.values()):
        return [seqs]
    order = sorted(seqs, key=lambda s: (context_lens[s], q_lens[s]))
    n = len(order)
    blocks = [blocks_of[s] for s in order]  # rising: a part's longest is its last
    q_head, q_tail = [0] * (n + 1), [0] * (n + 1)  # longest q_len of order[:i] and of order[i:]
    for i, s in enumerate(order):
        q_head[i + 1] = max(q_head[i], q_lens[s])
    for i in range(n - 1, -1, -1):
        q_tail[i] = max(q_tail[i + 1], q_lens[order[i]])
    whole = n * q_head[n] * blocks[-1]
    best, cut = whole, 0
    for i in range(min_size, n - min_size + 1):
        split = i * q_head[i] * blocks[i - 1] + (n - i) * q_tail[i] * blocks[-1]
        if split < best:
            best, cut = split, i
    if cut == 0 or best > 0.7 * whole:
        return [seqs]
    return [sorted(order[:cut]), sorted(order[cut:])]


def store_kvcache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """:func:`minipaged.attention.reference.store_kvcache`, as one ``index_copy_`` per tensor when
    no slot is -1 (the engine never pads): the boolean filtering is the costly part."""
    if bool((slot_mapping < 0).any()):
        reference.store_kvcache(key, value, k_cache, v_cache, slot_mapping)
        return
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def _gather(cache: torch.Tensor, grp: RowGroup) -> torch.Tensor:
    """[g, kv_heads, num_blocks * block_size, d]: the group's contexts in logical order, in fp32,
    contiguous.

    ``index_select`` over whole blocks (rows of ``block_size * kv_heads * d`` numbers) copies
    contiguous runs, several times faster here than indexing the 4-D cache with a 2-D table.
    The second pass puts each KV head's keys together (and widens a bf16 cache to fp32) in one
    copy: the attention products then read it as it lies. Left as a strided view, every
    ``matmul`` would copy it again, inside, in every layer.
    """
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    picked = cache.view(num_blocks, -1).index_select(0, grp.blocks)
    per_head = picked.view(grp.seqs.numel(), -1, num_kv_heads, head_dim).transpose(1, 2)
    return per_head.to(torch.float32, memory_format=torch.contiguous_format)


SMALL_DECODE = 2**20  # cached numbers (K of a group) under which decode attention runs on one thread


def _attend_group(
    out: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    grp: RowGroup,
    scale: float | None,
    lib: ctypes.CDLL | None = None,
) -> None:
    """Attention of one group's rows, written into ``out`` (packed like ``q``); decode rows go to
    the compiled kernel ``lib`` when given (:mod:`minipaged.attention.native_decode`)."""
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    g = grp.seqs.numel()
    if grp.max_q_len == 1 and lib is not None:
        cached = g * grp.num_blocks * k_cache.shape[1] * num_kv_heads * head_dim
        qd = q if grp.all_rows else q[grp.rows]
        o = native_decode.paged_decode(
            lib, qd, k_cache, v_cache, grp.tables, grp.context_lens, scale, 1 if cached < SMALL_DECODE else None
        )
        if grp.all_rows:
            out.copy_(o)
        else:
            out[grp.rows] = o.to(out.dtype)
        return
    k, v = _gather(k_cache, grp), _gather(v_cache, grp)
    if grp.max_q_len == 1:
        # Decode: the query heads that share a KV head become the query rows of one attention over
        # that head's keys ([g, kv_heads, group, d]); twice as fast here as SDPA's enable_gqa.
        qd = q if grp.all_rows else q[grp.rows]  # a pure decode step needs no gather
        qd = qd.float().view(g, num_kv_heads, num_heads // num_kv_heads, head_dim)
        # softmax(q k^T * scale + bias) v, written out rather than SDPA: its CPU kernel splits even a
        # one-row decode over every thread and waits for all of them, which on a shared machine
        # cost milliseconds a layer (16 ms against 0.1 ms for these products at one row on 2 busy
        # cores). Small products run on one thread for the same reason (a switch costs < 1 us).
        threads = torch.get_num_threads()
        torch.set_num_threads(1 if k.numel() < SMALL_DECODE else threads)
        try:
            scores = torch.matmul(qd, k.transpose(-1, -2)).mul_(head_dim**-0.5 if scale is None else scale)
            o = torch.matmul(scores.add_(grp.bias).softmax(dim=-1), v).reshape(g, num_heads, head_dim)
        finally:
            torch.set_num_threads(threads)
        if grp.all_rows:
            out.copy_(o)
        else:
            out[grp.rows] = o.to(out.dtype)
        return
    gqa = num_heads != num_kv_heads
    qp = q.new_zeros((g * grp.max_q_len, num_heads, head_dim), dtype=torch.float32)
    qp[grp.flat] = q[grp.rows].float()
    qp = qp.view(g, grp.max_q_len, num_heads, head_dim).transpose(1, 2)  # [g, heads, max_q, d]
    o = F.scaled_dot_product_attention(qp, k, v, attn_mask=grp.bias, scale=scale, enable_gqa=gqa)
    out[grp.rows] = o.transpose(1, 2).reshape(-1, num_heads, head_dim)[grp.flat].to(out.dtype)


class TorchBackend:
    """This module as an attention backend (:mod:`minipaged.attention.backends`): the row layout
    and masks depend on the lengths only, so they are planned once per step (:func:`plan_batch`,
    which also keeps decode rows apart from prefill rows); each layer then attends group by group.

    Decode rows are read in place by the compiled kernel where one builds on this machine
    (``in_place=None``: wherever it can; ``False``: the plain-torch gather everywhere)."""

    name = "torch"
    store_kvcache = staticmethod(store_kvcache)

    def __init__(self, in_place: bool | None = None) -> None:
        self.lib = None if in_place is False else native_decode.load()
        if in_place and self.lib is None:
            raise RuntimeError("in_place=True needs the compiled decode kernel, and it did not build here")

    def plan(self, meta: PagedMetadata, block_size: int) -> BatchPlan:
        in_place = self.lib is not None and meta.block_tables.device.type == "cpu"
        return plan_batch(meta.host_q_lens, meta.host_context_lens, meta.block_tables, block_size, in_place)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedMetadata, plan: BatchPlan
    ) -> torch.Tensor:
        lib = self.lib if native_decode.supports(q, k_cache) else None
        return _attend_planned(q, k_cache, v_cache, plan, None, lib)


def _attend_planned(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: BatchPlan,
    scale: float | None,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """The packed queries ``q`` attend group by group, as ``plan`` lays them out."""
    out = torch.empty_like(q)
    for grp in plan.decode + plan.prefill:
        _attend_group(out, q, k_cache, v_cache, grp, scale, lib)
    return out


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    plan: BatchPlan | None = None,
) -> torch.Tensor:
    """Packed new queries attend to their sequences' paged K/V (any mix of prefill and decode).

    q: [total_new_tokens, num_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size,
    num_kv_heads, head_dim]; block_tables: int32 [num_seqs, max_blocks]; cu_seqlens_q: int32
    [num_seqs + 1]; context_lens: int32 [num_seqs]. Returns [total_new_tokens, num_heads,
    head_dim] in q's dtype. ``plan`` (from :func:`plan_batch`) skips recomputing the layout.
    """
    if plan is None:
        bounds = cu_seqlens_q.tolist()
        q_lens = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
        plan = plan_batch(q_lens, context_lens.tolist(), block_tables, k_cache.shape[1])
    return _attend_planned(q, k_cache, v_cache, plan, scale)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    plan: BatchPlan | None = None,
) -> torch.Tensor:
    """One new query token per sequence: q: [num_seqs, num_heads, head_dim] -> same shape."""
    cu_seqlens_q = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, plan=plan)
