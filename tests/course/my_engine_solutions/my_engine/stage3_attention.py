"""Stage 3 (notebook 03): slot mapping, the K/V write, and paged attention in torch."""

from __future__ import annotations

import torch


def slot_mapping(block_tables: list[list[int]], starts: list[int], ends: list[int], block_size: int) -> torch.Tensor:
    slots = [
        table[pos // block_size] * block_size + pos % block_size
        for table, start, end in zip(block_tables, starts, ends)
        for pos in range(start, end)
    ]
    return torch.tensor(slots, dtype=torch.int64)


def store_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep].to(v_cache.dtype)


def _gather(cache, table, n):
    block_size = cache.shape[1]
    blocks = table[: -(-n // block_size)].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:n]


def _attend(q, k, v, scale, first_pos):
    # q: [q_len, H, D]; k, v: [n, KVH, D]; query i at position first_pos + i sees keys 0..that position
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    pos_q = first_pos + torch.arange(q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > pos_q, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        k, v = _gather(k_cache, block_tables[i], n), _gather(v_cache, block_tables[i], n)
        out[i : i + 1] = _attend(q[i : i + 1], k, v, scale, n - 1)
    return out


def paged_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    for i, n in enumerate(context_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if end > start:
            k, v = _gather(k_cache, block_tables[i], n), _gather(v_cache, block_tables[i], n)
            out[start:end] = _attend(q[start:end], k, v, scale, n - (end - start))
    return out
