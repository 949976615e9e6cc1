"""Reference solutions for stage 0 (notebook 00_contiguous_baseline)."""

from __future__ import annotations

import torch

from minipaged.kv.contiguous import ArenaFullError, FirstFitArena
from minipaged.model.config import ModelConfig


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V that one token occupies in the cache, over all layers."""
    bytes_per_number = torch.empty((), dtype=dtype).element_size()
    # Only the KV heads are cached: with grouped-query attention several query heads share one.
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * bytes_per_number


class BestFitArena(FirstFitArena):
    """A ``FirstFitArena`` whose ``reserve`` puts a reservation in the smallest hole that fits."""

    def reserve(self, owner, size: int) -> int:
        if owner in self._spans:
            raise ValueError(f"{owner!r} already holds a reservation")
        if size < 1:
            raise ValueError(f"reservation size must be >= 1, got {size}")
        fitting = [(hole, start) for start, hole in self.holes() if hole >= size]
        if not fitting:
            raise ArenaFullError(
                f"no hole fits {size} slots (largest hole {self.largest_hole}, {self.free_slots} slots free)"
            )
        _, start = min(fitting)  # smallest hole; on a tie the lowest address
        self._spans[owner] = (start, size)
        return start
