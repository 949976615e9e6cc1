"""Stage 0 exercises (notebook 00_contiguous_baseline). Check: ``python -m exercises stage0``.

Replace each ``raise NotImplementedError`` with your code. Keep the names and signatures: the
tests import them from this file.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from minipaged.kv.contiguous import ArenaFullError, FirstFitArena  # noqa: F401  (you will need both)
from minipaged.model.config import ModelConfig


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V that one token occupies in the cache, over all layers.

    config: any ``ModelConfig`` (``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads``, ``head_dim``, ...); dtype: the cache's dtype (``torch.float32``,
    ``torch.bfloat16``, ...).

    The embedded model (2 layers, 2 KV heads of 32 dims) in fp32 gives 1024. It must agree with
    ``ContiguousKVCache(...).nbytes()`` divided by the cache's slots, for any model.

    Hint: which heads are cached, the query heads or the KV heads? With grouped-query attention
    they differ. ``torch.empty((), dtype=dtype).element_size()`` is the size of one number.
    """
    raise NotImplementedError


class BestFitArena(FirstFitArena):
    """A ``FirstFitArena`` whose ``reserve`` puts a reservation in the *smallest* hole that fits.

    Everything else (``free``, ``holes()``, ``span``, ``largest_hole``,
    ``external_fragmentation``) is inherited. ``reserve(owner, size) -> start``:

    - among the holes of ``holes()`` (``(start, size)`` in address order) with ``size >= size``,
      take the smallest; on a tie, the one at the lowest address; the reservation starts at the
      hole's start;
    - record it the way ``FirstFitArena.reserve`` does (read it: ``self._spans[owner] = (start, size)``);
    - keep its checks: ``ValueError`` for an owner that already holds a reservation or a size < 1,
      ``ArenaFullError`` when no hole fits (and the arena is left unchanged).

    Example: 100 slots, holes ``(10, 30)`` and ``(50, 20)``; ``reserve("x", 15)`` returns 50
    (first fit would return 10).
    """

    def reserve(self, owner: Hashable, size: int) -> int:
        raise NotImplementedError
