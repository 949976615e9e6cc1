"""How the model's attention layers reach a KV cache: ``attn.attend(layer, q, k, v)``.

Every attention layer of the decoder calls ``attend`` with this step's new tokens, packed:
``q: [num_tokens, num_heads, head_dim]``, ``k, v: [num_tokens, num_kv_heads, head_dim]`` (RoPE
already applied). The object decides where K/V go and what they attend to, so each stage plugs
a new cache into the same model:

- :class:`RecomputeAttention`: no cache, the whole sequence is passed every step (the oracle);
- :class:`PagedAttention` (stages 3-5): a block pool, written by ``slot_mapping`` and read
  through ``block_tables``, by an attention backend (:mod:`minipaged.attention.backends`).
  Stage 0's contiguous reservations are read by it too, as pools of one-slot blocks
  (:meth:`minipaged.kv.contiguous.FirstFitArena.table`).

**What one step tells every paged layer**: :class:`PagedMetadata`, built once per step.

A step packs the new tokens of every scheduled sequence back to back. Sequence ``i`` already
holds ``starts[i]`` tokens in the cache and brings ``q_lens[i]`` new ones (a whole prompt, a
chunk of it, or the one token sampled last). From that and the sequences' block tables come

- ``slot_mapping``: int64 [num_tokens], where each new token's K/V is written
  (``block_id * block_size + offset``, stage 3);
- ``block_tables``: int32 [num_seqs, max_blocks], where each sequence's context is read;
- ``context_lens``: int32 [num_seqs], tokens in the cache once this step's are written;
- ``cu_seqlens_q``: int32 [num_seqs + 1], where each sequence's queries start in the packing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from minipaged.attention import reference
from minipaged.kv.block_table import padded_block_tables
from minipaged.kv.slot_mapping import SlotMappingFn, build_slot_mapping

if TYPE_CHECKING:
    from minipaged.attention.backends import AttentionBackend

__all__ = ["CacheAttention", "PagedAttention", "PagedMetadata", "RecomputeAttention"]


@dataclass
class PagedMetadata:
    """The step's tensors (above), plus ``host_q_lens`` and ``host_context_lens``: the same lengths
    as Python lists, since reading them back from a GPU would stall every layer on a copy."""

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
        slot_mapping: SlotMappingFn = build_slot_mapping,
    ) -> PagedMetadata:
        """Sequence ``i`` holds ``starts[i]`` cached tokens and brings ``q_lens[i]`` new ones.

        ``slot_mapping`` computes the slots (the engine passes ``EnginePlugins.slot_mapping``)."""
        ends = [a + n for a, n in zip(starts, q_lens)]
        cu = [0]
        for n in q_lens:
            cu.append(cu[-1] + n)
        return cls(
            slot_mapping=slot_mapping(block_tables, starts, ends, block_size, device),
            block_tables=padded_block_tables(block_tables, device=device),
            context_lens=torch.tensor(ends, dtype=torch.int32, device=device),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
            host_q_lens=list(q_lens),
            host_context_lens=ends,
        )

    @property
    def max_q_len(self) -> int:
        return max(self.host_q_lens, default=0)


class CacheAttention(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class RecomputeAttention:
    """No cache: causal attention within each packed sequence (``cu_seqlens: [num_seqs + 1]``)."""

    def __init__(self, cu_seqlens: torch.Tensor) -> None:
        self.cu_seqlens = cu_seqlens

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return reference.varlen_attention(q, k, v, self.cu_seqlens)


class PagedAttention:
    """Writes each layer's new K/V by ``slot_mapping``, then attends through ``block_tables``.

    k_cache, v_cache: ``[num_layers, num_blocks, block_size, num_kv_heads, head_dim]``.
    ``set_batch`` takes the step's metadata and lets the backend plan once for every layer
    (whatever the backend decides from the step's lengths, such as a decode-only launch, is
    decided there); ``attend`` is then one ``store_kvcache`` and one ``backend.attend`` a layer.
    """

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, backend: AttentionBackend) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache
        self.backend = backend
        self.meta: PagedMetadata | None = None
        self.plan: Any = None

    def set_batch(self, meta: PagedMetadata) -> None:
        self.meta = meta
        self.plan = self.backend.plan(meta, self.k_cache.shape[2])

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        m = self.meta
        if m is None:
            raise RuntimeError("call set_batch(meta) before the forward")
        k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
        self.backend.store_kvcache(k, v, k_cache, v_cache, m.slot_mapping)
        return self.backend.attend(q, k_cache, v_cache, m, self.plan)
