"""What one step tells every paged attention layer: :class:`PagedMetadata`, built once per step.

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

import torch

from minipaged.kv.block_table import padded_block_tables
from minipaged.kv.slot_mapping import SlotMappingFn, build_slot_mapping

__all__ = ["PagedMetadata"]


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
