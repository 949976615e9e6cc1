"""Stage 0 (notebook 00): one contiguous buffer of ``max_seq_len`` slots per sequence.

Check: the last cell of notebook 00, or ``python -m exercises my_engine 0``.
"""

from __future__ import annotations


class CacheFullError(RuntimeError):
    """No hole in the slot array is big enough for another buffer."""


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """**core** — bytes of K/V one token takes: a key and a value per layer and per KV head.

    ``kv_bytes_per_token(2, 2, 32, 4)`` is 1024 (the embedded model in fp32).
    """
    raise NotImplementedError("kv_bytes_per_token: 2 (K and V) x layers x KV heads x head_dim x bytes")


class ContiguousCache:
    """A slot array of ``num_slots`` slots; every sequence reserves ``max_seq_len`` of them in one piece."""

    def __init__(self, num_slots: int, max_seq_len: int) -> None:
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.starts: dict[object, int] = {}  # seq_id -> first slot of its buffer

    def reserve(self, seq_id: object) -> int:
        """**core** — reserve ``max_seq_len`` slots for ``seq_id`` by **first fit**; return the first slot.

        First fit: the lowest start where ``max_seq_len`` free slots follow one another (a freed
        buffer leaves a hole that a later one may fill). No such hole: raise ``CacheFullError``.
        """
        raise NotImplementedError("ContiguousCache.reserve: the first hole of max_seq_len free slots, from slot 0")

    def free(self, seq_id: object) -> None:
        """**core** — give ``seq_id``'s buffer back."""
        raise NotImplementedError("ContiguousCache.free: forget seq_id's buffer")

    def slot(self, seq_id: object, pos: int) -> int:
        """**core** — the slot of token ``pos`` of ``seq_id``; ``IndexError`` unless ``0 <= pos < max_seq_len``."""
        raise NotImplementedError("ContiguousCache.slot: start + pos, IndexError past the buffer")

    def waste(self, num_tokens: dict[object, int]) -> float:
        """**stretch** — the share of the reserved slots that hold no token (``num_tokens``: seq_id -> tokens)."""
        raise NotImplementedError("ContiguousCache.waste: 1 - tokens / reserved slots")
