"""How the model's attention layers reach a KV cache: ``attn.attend(layer, q, k, v)``.

Every attention layer of the decoder calls ``attend`` with this step's new tokens, packed:
``q: [num_tokens, num_heads, head_dim]``, ``k, v: [num_tokens, num_kv_heads, head_dim]`` (RoPE
already applied). The object decides where K/V go and what they attend to, so each stage plugs
a new cache into the same model:

- :class:`RecomputeAttention`: no cache, the whole sequence is passed every step (the oracle);
- :class:`ContiguousAttention` (stage 0): one reserved range of slots per sequence;
- :class:`PagedAttention` (stages 3-4): a block pool, written by ``slot_mapping`` and read
  through ``block_tables``.

The paged and contiguous caches run the same three operations of one *attention backend*
(:mod:`minipaged.attention.backends`): the reference, the batched torch path or Triton.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

import torch

from minipaged.attention import batched, reference
from minipaged.kv.block_table import padded_block_tables
from minipaged.kv.contiguous import ContiguousKVCache
from minipaged.kv.paged_cache import PagedKVCache
from minipaged.kv.slot_mapping import build_slot_mapping


class CacheAttention(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class RecomputeAttention:
    """No cache: causal attention within each packed sequence (``cu_seqlens: [num_seqs + 1]``)."""

    def __init__(self, cu_seqlens: torch.Tensor) -> None:
        self.cu_seqlens = cu_seqlens

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return reference.varlen_attention(q, k, v, self.cu_seqlens)


@dataclass
class PagedMetadata:
    """What one step tells the paged attention layers (built once, read by every layer).

    slot_mapping: int64 [num_tokens] (-1 = do not write); block_tables: int32 [num_seqs,
    max_blocks]; context_lens: int32 [num_seqs] (tokens in the cache after this step's write);
    cu_seqlens_q: int32 [num_seqs + 1] (the packing of the new tokens). ``host_q_lens`` and
    ``host_context_lens`` are the same lengths as Python lists: reading them back from a GPU
    would stall every layer on a device-to-host copy.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    host_q_lens: list[int]
    host_context_lens: list[int]

    @classmethod
    def build(
        cls,
        block_tables: Sequence[Sequence[int]],
        starts: Sequence[int],
        q_lens: Sequence[int],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> PagedMetadata:
        """Sequence ``i`` holds ``starts[i]`` cached tokens and brings ``q_lens[i]`` new ones
        (a prefill brings its prompt or a chunk of it, a decode one token)."""
        ends = [a + n for a, n in zip(starts, q_lens)]
        cu = [0]
        for n in q_lens:
            cu.append(cu[-1] + n)
        return cls(
            slot_mapping=build_slot_mapping(block_tables, starts, ends, block_size, device),
            block_tables=padded_block_tables(block_tables, device=device),
            context_lens=torch.tensor(ends, dtype=torch.int32, device=device),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
            host_q_lens=list(q_lens),
            host_context_lens=ends,
        )

    @property
    def is_decode(self) -> bool:
        """Every sequence brings exactly one new token."""
        return all(n == 1 for n in self.host_q_lens)


class PagedAttention:
    """Writes each layer's new K/V by ``slot_mapping``, then attends through ``block_tables``.

    ``ops`` is an attention backend module (see :func:`minipaged.attention.backends.get_ops`).
    """

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, ops: ModuleType) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache  # [num_layers, num_blocks, block_size, kv_heads, d]
        self.ops = ops
        self.meta: PagedMetadata | None = None
        self._hints: dict = {}  # per-step facts that spare each layer recomputing them

    @classmethod
    def of(cls, cache: PagedKVCache, ops: ModuleType) -> PagedAttention:
        return cls(cache.k, cache.v, ops)

    def set_batch(self, meta: PagedMetadata) -> None:
        self.meta = meta
        if self.ops is batched:  # its row layout and masks depend on the lengths only: once per step
            lengths = (meta.host_q_lens, meta.host_context_lens)
            self._hints = {"plan": batched.plan_batch(*lengths, meta.block_tables, self.k_cache.shape[2])}
        elif self.ops is not reference and not meta.is_decode:  # Triton's prefill grid needs max_q_len
            self._hints = {"max_q_len": max(meta.host_q_lens, default=0)}
        else:
            self._hints = {}

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        m = self.meta
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        self.ops.store_kvcache(k, v, k_cache, v_cache, m.slot_mapping)
        if m.is_decode:
            return self.ops.paged_decode_attention(q, k_cache, v_cache, m.block_tables, m.context_lens, **self._hints)
        return self.ops.paged_prefill_attention(
            q, k_cache, v_cache, m.block_tables, m.cu_seqlens_q, m.context_lens, **self._hints
        )


class ContiguousAttention:
    """Stage 0's cache under the same attention: each sequence's buffer is a range of slots.

    A contiguous reservation is a paged cache whose blocks hold one token each and whose block
    table is ``start, start + 1, ...``: so the same paged operations serve it, and comparing the
    two caches compares memory management alone, not two attention implementations.
    """

    def __init__(self, cache: ContiguousKVCache, ops: ModuleType = reference) -> None:
        self.cache = cache
        # [num_layers, num_slots, kv_heads, d] viewed as [num_layers, num_slots, 1, kv_heads, d]
        self.paged = PagedAttention(cache.k.unsqueeze(2), cache.v.unsqueeze(2), ops)
        self.q_lens: list[int] = []

    def set_batch(self, seq_ids: Sequence[Hashable], q_lens: Sequence[int], context_lens: Sequence[int]) -> None:
        """Sequence ``i`` brings ``q_lens[i]`` new tokens (packed in this order) and holds
        ``context_lens[i]`` tokens once they are written."""
        if not len(seq_ids) == len(q_lens) == len(context_lens):
            raise ValueError("seq_ids, q_lens and context_lens must have the same length")
        starts = []
        for seq_id, q_len, context_len in zip(seq_ids, q_lens, context_lens):
            if not 0 <= q_len <= context_len:
                raise ValueError(f"sequence {seq_id!r}: need 0 <= q_len ({q_len}) <= context_len ({context_len})")
            # Fail before layer 0 writes anything rather than halfway through the batch.
            self.cache.check_fits(seq_id, context_len)
            starts.append(self.cache.arena.span(seq_id)[0])
        for seq_id, context_len in zip(seq_ids, context_lens):
            self.cache.num_tokens[seq_id] = max(self.cache.num_tokens[seq_id], context_len)
        tables = [range(s, s + c) for s, c in zip(starts, context_lens)]
        cached = [c - n for c, n in zip(context_lens, q_lens)]
        self.q_lens = list(q_lens)
        self.paged.set_batch(PagedMetadata.build(tables, cached, q_lens, 1, self.cache.k.device))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim] -> like q."""
        if q.shape[0] != sum(self.q_lens):
            raise ValueError(f"got {q.shape[0]} tokens, set_batch announced {sum(self.q_lens)}")
        return self.paged.attend(layer, q, k, v)
