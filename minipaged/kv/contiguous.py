"""Stage 0: the contiguous baseline that PagedAttention replaces.

Classic servers give each sequence one contiguous K/V buffer ``[num_layers, max_seq_len,
num_kv_heads, head_dim]``, reserved up front because the output length is unknown. Here all
buffers are carved out of one slot arena by first fit, which makes both kinds of waste
measurable:

- internal: reserved slots no token will ever fill (:class:`ContiguousStats`);
- external: free slots split into holes too small for the next reservation
  (:attr:`FirstFitArena.external_fragmentation`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch


class ArenaFullError(RuntimeError):
    """No hole is large enough for a reservation (the arena is left unchanged)."""


class ReservationExceededError(RuntimeError):
    """A sequence grew past the slots reserved for it."""


class FirstFitArena:
    """``num_slots`` slots, handed out as contiguous ranges; each reservation goes in the first hole that fits."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._spans: dict[Hashable, tuple[int, int]] = {}  # owner -> (start, size)

    def reserve(self, owner: Hashable, size: int) -> int:
        """Reserve ``size`` contiguous slots for ``owner``; return the first slot."""
        if owner in self._spans:
            raise ValueError(f"{owner!r} already holds a reservation")
        if size < 1:
            raise ValueError(f"reservation size must be >= 1, got {size}")
        for start, hole in self.holes():
            if hole >= size:
                self._spans[owner] = (start, size)
                return start
        if size <= self.free_slots:
            raise ArenaFullError(
                f"no hole fits {size} slots: the largest hole is {self.largest_hole} although "
                f"{self.free_slots} slots are free (external fragmentation)"
            )
        raise ArenaFullError(f"asked for {size} slots, only {self.free_slots} free of {self.num_slots}")

    def __contains__(self, owner: Hashable) -> bool:
        """Whether ``owner`` holds a reservation."""
        return owner in self._spans

    def free(self, owner: Hashable) -> None:
        if owner not in self._spans:
            raise KeyError(f"{owner!r} holds no reservation")
        del self._spans[owner]

    def span(self, owner: Hashable) -> tuple[int, int]:
        """(start, size) of ``owner``'s reservation."""
        if owner not in self._spans:
            raise KeyError(f"{owner!r} holds no reservation")
        return self._spans[owner]

    def table(self, owner: Hashable, num_tokens: int) -> range:
        """The slots of ``owner``'s first ``num_tokens`` tokens, ``range(start, start + num_tokens)``.

        A reservation read as a block table whose blocks hold one slot each: the one way
        contiguous KV is addressed (here, by the static runner, by the engine's contiguous layout),
        so the same paged attention reads it. Raises ReservationExceededError when the tokens
        would spill past the reservation into a neighbour's.
        """
        start, size = self.span(owner)
        if num_tokens > size:
            raise ReservationExceededError(f"sequence {owner!r} needs {num_tokens} slots but reserved only {size}")
        return range(start, start + num_tokens)

    def reservations(self) -> dict[Hashable, tuple[int, int]]:
        """owner -> (start, size), in address order."""
        return dict(sorted(self._spans.items(), key=lambda item: item[1][0]))

    def holes(self) -> list[tuple[int, int]]:
        """(start, size) of every maximal free range, in address order."""
        holes, cursor = [], 0
        for start, size in sorted(self._spans.values()):
            if start > cursor:
                holes.append((cursor, start - cursor))
            cursor = start + size
        if cursor < self.num_slots:
            holes.append((cursor, self.num_slots - cursor))
        return holes

    @property
    def free_slots(self) -> int:
        return self.num_slots - sum(size for _, size in self._spans.values())

    @property
    def largest_hole(self) -> int:
        return max((size for _, size in self.holes()), default=0)

    @property
    def external_fragmentation(self) -> float:
        """1 - largest_hole / free_slots: the share of free memory a maximal request cannot use (0 if none free)."""
        free = self.free_slots
        return 0.0 if free == 0 else 1.0 - self.largest_hole / free


@dataclass
class ContiguousStats:
    """Slots reserved by all sequences versus slots holding a token."""

    reserved_slots: int
    used_slots: int

    @property
    def waste_pct(self) -> float:
        """Percentage of reserved slots holding no token (0 when nothing is reserved)."""
        return 0.0 if self.reserved_slots == 0 else 100.0 * (1 - self.used_slots / self.reserved_slots)


class ContiguousKVCache:
    """K/V tensors ``[num_layers, num_slots, num_kv_heads, head_dim]``, a contiguous range of slots per sequence.

    Size the arena with ``num_slots``, or with ``max_seqs`` (room for that many ``max_seq_len`` buffers).
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        max_seqs: int | None = None,
        num_slots: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_slots is None and max_seqs is not None:
            num_slots = max_seqs * max_seq_len
        elif num_slots is None or max_seqs is not None:
            raise ValueError("give exactly one of max_seqs and num_slots")
        self.max_seq_len = max_seq_len
        self.arena = FirstFitArena(num_slots)
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_tokens: dict[Hashable, int] = {}  # seq_id -> tokens written so far

    def add_sequence(self, seq_id: Hashable, reserve: int | None = None) -> int:
        """Reserve ``reserve`` slots (default ``max_seq_len``) for a new sequence; return its first slot."""
        start = self.arena.reserve(seq_id, self.max_seq_len if reserve is None else reserve)
        self.num_tokens[seq_id] = 0
        return start

    def remove_sequence(self, seq_id: Hashable) -> None:
        self.arena.free(seq_id)
        del self.num_tokens[seq_id]

    def reservations(self) -> dict[Hashable, tuple[int, int]]:
        """seq_id -> (first slot, reserved slots), in address order."""
        return self.arena.reservations()

    def can_reserve(self, size: int | None = None) -> bool:
        """Whether :meth:`add_sequence` with ``reserve=size`` (default ``max_seq_len``) would succeed now."""
        return self.arena.largest_hole >= (self.max_seq_len if size is None else size)

    def write(self, layer: int, seq_id: Hashable, pos: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V ``[n, num_kv_heads, head_dim]`` of positions ``pos .. pos + n - 1`` of a sequence."""
        end = pos + k.shape[0]
        # Checked: a long sequence would otherwise silently overwrite its neighbour's buffer.
        slots = self.arena.table(seq_id, end)[pos:]
        self.k[layer, slots.start : slots.stop] = k.to(self.k.dtype)
        self.v[layer, slots.start : slots.stop] = v.to(self.v.dtype)
        self.num_tokens[seq_id] = max(self.num_tokens[seq_id], end)

    def read(self, layer: int, seq_id: Hashable, context_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[context_len, num_kv_heads, head_dim]`` of a sequence's first tokens (views, no copy)."""
        slots = self.arena.table(seq_id, context_len)
        return self.k[layer, slots.start : slots.stop], self.v[layer, slots.start : slots.stop]

    def stats(self) -> ContiguousStats:
        reserved = sum(size for _, size in self.reservations().values())
        return ContiguousStats(reserved_slots=reserved, used_slots=sum(self.num_tokens.values()))

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
