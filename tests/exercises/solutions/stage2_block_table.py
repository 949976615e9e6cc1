"""Reference solutions for stage 2 (notebook 02_block_table)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def physical(block_ids: Sequence[int], block_size: int, pos: int) -> tuple[int, int]:
    """``(physical block id, offset in that block)`` of token position ``pos``."""
    if not 0 <= pos < len(block_ids) * block_size:
        raise IndexError(f"position {pos} is outside the {len(block_ids)} blocks of {block_size} slots")
    return int(block_ids[pos // block_size]), pos % block_size


def gather(cache: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, num_tokens: int) -> torch.Tensor:
    """One sequence's first ``num_tokens`` rows of a paged cache, in logical order, one position at a time."""
    block_size = cache.shape[1]
    out = torch.empty((num_tokens, *cache.shape[2:]), dtype=cache.dtype, device=cache.device)
    for pos in range(num_tokens):
        block, offset = physical(block_ids, block_size, pos)
        out[pos] = cache[block, offset]
    return out
