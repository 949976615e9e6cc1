"""Stage 3: slot mapping, where each new token's K/V goes in the paged pool.

A physical slot is one token's place in the pool: ``slot = block_id * block_size + offset``.
Viewing a cache ``[num_blocks, block_size, num_kv_heads, head_dim]`` as ``[num_slots,
num_kv_heads, head_dim]`` makes the write of a batch's new K/V one scatter by slot
(``store_kvcache`` in :mod:`minipaged.attention.reference`, :mod:`minipaged.kernels`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from minipaged.utils import cdiv

PAD_SLOT = -1  # a slot_mapping entry that writes nothing (padding tokens)

# (block_tables, starts, ends, block_size, device) -> int64 [num_new_tokens]: build_slot_mapping's
# signature, the engine's ``EnginePlugins.slot_mapping``.
SlotMappingFn = Callable[
    [Sequence[Sequence[int]], Sequence[int], Sequence[int], int, "torch.device | str"], torch.Tensor
]


def slots_for(block_table: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    """Slots of token positions ``start .. end - 1`` of one sequence whose blocks are ``block_table``."""
    if end > len(block_table) * block_size:
        raise ValueError(
            f"positions up to {end - 1} need {cdiv(end, block_size)} blocks, the table has {len(block_table)}"
        )
    return [block_table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]


def build_slot_mapping(
    block_tables: Sequence[Sequence[int]],
    starts: Sequence[int],
    ends: Sequence[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """int64 [num_new_tokens]: the slot of every new token of a batch, sequences packed in order.

    Sequence ``i`` writes positions ``starts[i] .. ends[i] - 1`` (a prefill writes its whole
    prompt, a decode step writes one token).
    """
    slots: list[int] = []
    for table, start, end in zip(block_tables, starts, ends):
        slots += slots_for(table, start, end, block_size)
    return torch.tensor(slots, dtype=torch.int64, device=device)
