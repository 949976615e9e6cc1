"""Stage 0 (notebook 00): one contiguous buffer of ``max_seq_len`` slots per sequence."""

from __future__ import annotations


class CacheFullError(RuntimeError):
    """No hole in the slot array is big enough for another buffer."""


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


class ContiguousCache:
    def __init__(self, num_slots: int, max_seq_len: int) -> None:
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.starts: dict[object, int] = {}  # seq_id -> first slot of its buffer

    def reserve(self, seq_id: object) -> int:
        if seq_id in self.starts:
            raise ValueError(f"{seq_id!r} already holds a buffer")
        start = 0
        for taken in sorted(self.starts.values()):
            if taken - start >= self.max_seq_len:
                break
            start = taken + self.max_seq_len
        if start + self.max_seq_len > self.num_slots:
            raise CacheFullError(f"no hole of {self.max_seq_len} slots")
        self.starts[seq_id] = start
        return start

    def free(self, seq_id: object) -> None:
        del self.starts[seq_id]

    def slot(self, seq_id: object, pos: int) -> int:
        if not 0 <= pos < self.max_seq_len:
            raise IndexError(f"position {pos} is outside a buffer of {self.max_seq_len}")
        return self.starts[seq_id] + pos

    def waste(self, num_tokens: dict[object, int]) -> float:
        reserved = len(self.starts) * self.max_seq_len
        if reserved == 0:
            return 0.0
        return 1 - sum(num_tokens.get(s, 0) for s in self.starts) / reserved
