"""Static-batch greedy generation, the runner of stages 0-3 (no scheduler yet).

All prompts are prefilled together in one packed forward, then every step decodes one token
per sequence. Only the KV cache changes between stages, which makes their outputs comparable
token for token and logit for logit:

- ``"recompute"``: no cache; each step runs the whole sequence again (the oracle);
- ``"contiguous"`` (stage 0): each sequence reserves a ``max_seq_len`` buffer, addressed as the
  engine's contiguous layout addresses it: a block table ``range(start, start + n)`` of one-slot
  blocks, read by the same :class:`PagedAttention`;
- ``"paged"`` (stage 3): blocks from a pool, written by slot mapping, read through block tables.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minipaged.attention.backends import AttentionBackend
from minipaged.attention.cache_attention import (
    CacheAttention,
    PagedAttention,
    PagedMetadata,
    RecomputeAttention,
)
from minipaged.kernels.choose import get_backend
from minipaged.kv.block_pool import BlockPool
from minipaged.kv.block_table import BlockTable
from minipaged.kv.contiguous import ContiguousKVCache
from minipaged.kv.paged_cache import PagedKVCache
from minipaged.model.decoder import DecoderModel
from minipaged.utils import cdiv

CACHES = ("recompute", "contiguous", "paged")


@dataclass
class Generation:
    """tokens[i]: the new token ids of prompt i; logits[s]: [num_seqs, vocab] at step s."""

    tokens: list[list[int]]
    logits: list[torch.Tensor]
    cache: object | None = None  # the final KV state (ContiguousKVCache or PagedState), for inspection


@dataclass
class PagedState:
    kv: PagedKVCache
    pool: BlockPool
    tables: list[BlockTable]


@torch.inference_mode()
def greedy_generate(
    model: DecoderModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    cache: str = "paged",
    block_size: int = 16,
    num_blocks: int | None = None,
    shuffle_seed: int | None = 0,
    attention_backend: str = "reference",
) -> Generation:
    """Greedy-decode ``max_new_tokens`` tokens for each prompt (token id lists, any lengths).

    ``shuffle_seed`` scatters the paged pool's free list so that consecutive logical blocks
    land in unrelated physical blocks (None keeps them in order). ``attention_backend`` picks
    the paged and contiguous caches' operations (see :mod:`minipaged.attention.backends`).
    """
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    dev = model.device
    backend = get_backend(attention_backend, dev)
    seqs = [list(p) for p in prompts]
    store: ContiguousKVCache | PagedState | None = None  # None: recompute
    attention: PagedAttention | None = None
    if cache == "contiguous":
        store, attention = _contiguous_cache(model, backend, len(seqs), max(len(p) for p in seqs) + max_new_tokens)
    elif cache == "paged":
        need = sum(cdiv(len(p) + max_new_tokens, block_size) for p in seqs)
        store, attention = _paged_cache(
            model, backend, len(seqs), block_size, need if num_blocks is None else num_blocks, shuffle_seed
        )

    out_tokens: list[list[int]] = [[] for _ in seqs]
    step_logits: list[torch.Tensor] = []
    cached = [0] * len(seqs)  # tokens whose K/V are already in the cache
    for _ in range(max_new_tokens):
        if cache == "recompute":
            cached = [0] * len(seqs)
        new = [s[c:] for s, c in zip(seqs, cached)]
        q_lens = [len(n) for n in new]
        ctx = [len(s) for s in seqs]
        input_ids = torch.tensor([t for n in new for t in n], device=dev)
        positions = torch.tensor([p for c, s in zip(cached, seqs) for p in range(c, len(s))], device=dev)
        last = torch.tensor(q_lens, device=dev).cumsum(0) - 1  # each sequence's last new token
        attn: CacheAttention
        if store is None or attention is None:
            attn = RecomputeAttention(torch.nn.functional.pad(last + 1, (1, 0)).to(torch.int32))
        else:
            attn = _set_batch(store, attention, cached, ctx, q_lens)
        logits = model(input_ids, positions, attn, logits_indices=last)
        step_logits.append(logits)
        next_ids = logits.argmax(-1).tolist()
        cached = ctx
        for i, t in enumerate(next_ids):
            seqs[i].append(t)
            out_tokens[i].append(t)
    return Generation(out_tokens, step_logits, store)


def _contiguous_cache(
    model: DecoderModel, backend: AttentionBackend, num_seqs: int, max_len: int
) -> tuple[ContiguousKVCache, PagedAttention]:
    """One ``max_len`` reservation per sequence, read as a pool of one-slot blocks (as the engine's layout)."""
    cfg = model.config
    store = ContiguousKVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, max_seq_len=max_len, max_seqs=num_seqs,
        dtype=model.dtype, device=model.device,
    )  # fmt: skip
    for i in range(num_seqs):
        store.add_sequence(i)
    # [num_layers, num_slots, kv_heads, d] viewed as [num_layers, num_slots, 1, kv_heads, d]
    return store, PagedAttention(store.k.unsqueeze(2), store.v.unsqueeze(2), backend)


def _paged_cache(
    model: DecoderModel, backend: AttentionBackend, num_seqs: int, block_size: int, num_blocks: int,
    shuffle_seed: int | None,
) -> tuple[PagedState, PagedAttention]:  # fmt: skip
    """A pool of ``num_blocks`` (its free list shuffled by ``shuffle_seed``) and one table per sequence."""
    cfg = model.config
    pool = BlockPool(num_blocks)
    if shuffle_seed is not None:  # free every block once, in a random order
        blocks = pool.allocate(num_blocks)
        random.Random(shuffle_seed).shuffle(blocks)
        for b in blocks:
            pool.free([b])
    kv = PagedKVCache(
        cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, model.dtype, model.device
    )
    store = PagedState(kv, pool, [BlockTable(block_size) for _ in range(num_seqs)])
    return store, PagedAttention(kv.k, kv.v, backend)


def _set_batch(
    store: ContiguousKVCache | PagedState,
    attention: PagedAttention,
    cached: list[int],
    ctx: list[int],
    q_lens: list[int],
) -> PagedAttention:
    """Room for the step's new tokens, and the step's metadata for every layer."""
    dev = attention.k_cache.device
    if isinstance(store, ContiguousKVCache):
        # Every table is checked before layer 0 writes: an overflow leaves the neighbours intact.
        tables: list[Sequence[int]] = [store.arena.table(i, c) for i, c in enumerate(ctx)]
        attention.set_batch(PagedMetadata.build(tables, cached, q_lens, 1, dev))
        store.num_tokens.update(enumerate(ctx))  # this runner owns the cache's record
    else:
        for table, q in zip(store.tables, q_lens):
            table.append_tokens(q, store.pool)
        block_size = store.tables[0].block_size
        attention.set_batch(PagedMetadata.build([t.block_ids for t in store.tables], cached, q_lens, block_size, dev))
    return attention
