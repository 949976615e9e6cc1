"""Reference solutions for stage 3 (notebook 03_slot_mapping)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

PAD_SLOT = -1


def _rows(x) -> list:
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


def _slot(table: Sequence[int], pos: int, block_size: int) -> int:
    return int(table[pos // block_size]) * block_size + pos % block_size


def decode_slot_mapping(
    block_tables: Sequence[Sequence[int]] | torch.Tensor,
    context_lens: Sequence[int] | torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """int64 [num_seqs]: the slot of each sequence's new token, at position ``context_lens[i] - 1``."""
    tables, lens = _rows(block_tables), _rows(context_lens)
    return torch.tensor([_slot(t, n - 1, block_size) for t, n in zip(tables, lens)], dtype=torch.int64)


def prefill_slot_mapping(
    block_tables: Sequence[Sequence[int]] | torch.Tensor,
    prompt_lens: Sequence[int],
    block_size: int,
    pad_to: int,
) -> torch.Tensor:
    """int64 [pad_to]: every prompt token's slot, packed in order, then -1."""
    slots = [_slot(t, pos, block_size) for t, n in zip(_rows(block_tables), _rows(prompt_lens)) for pos in range(n)]
    if pad_to < len(slots):
        raise ValueError(f"pad_to ({pad_to}) is smaller than the {len(slots)} prompt tokens")
    return torch.tensor(slots + [PAD_SLOT] * (pad_to - len(slots)), dtype=torch.int64)


def gather_sequence_kv(
    cache: torch.Tensor, block_table: Sequence[int] | torch.Tensor, context_len: int
) -> torch.Tensor:
    """[context_len, num_kv_heads, head_dim] from the slot formula and one index operation."""
    block_size = cache.shape[1]
    table = _rows(block_table)
    slots = torch.tensor([_slot(table, pos, block_size) for pos in range(context_len)], dtype=torch.int64)
    return cache.reshape(-1, *cache.shape[2:])[slots.to(cache.device)]
