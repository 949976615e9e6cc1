"""Stage 0: the first-fit arena and the contiguous KV cache."""

from __future__ import annotations

import pytest

from minipaged.kv.contiguous import (
    ArenaFullError,
    ContiguousKVCache,
    ContiguousStats,
    FirstFitArena,
    ReservationExceededError,
)


def fragmented_arena() -> FirstFitArena:
    """100 slots: [a: 0-29 freed] [b: 30-49] [c: 50-79] [free: 80-99]."""
    arena = FirstFitArena(100)
    assert [arena.reserve(o, n) for o, n in (("a", 30), ("b", 20), ("c", 30))] == [0, 30, 50]
    arena.free("a")
    return arena


def test_first_fit_takes_the_first_hole_not_the_tightest():
    arena = fragmented_arena()
    assert arena.holes() == [(0, 30), (80, 20)]
    assert arena.reserve("d", 10) == 0  # best fit would pick the 20-slot hole at 80
    assert arena.holes() == [(10, 20), (80, 20)]
    assert arena.reserve("e", 20) == 10  # an exact fit fills the hole
    assert arena.reservations() == {"d": (0, 10), "e": (10, 20), "b": (30, 20), "c": (50, 30)}
    assert arena.span("b") == (30, 20)
    assert (arena.free_slots, arena.largest_hole) == (20, 20)


def test_a_reservation_is_addressed_as_a_table_of_one_slot_blocks():
    arena = fragmented_arena()
    assert arena.table("b", 7) == range(30, 37) and arena.table("c", 30) == range(50, 80)
    assert arena.table("c", 0) == range(50, 50)
    with pytest.raises(ReservationExceededError, match="sequence 'b' needs 21 slots but reserved only 20"):
        arena.table("b", 21)
    with pytest.raises(KeyError, match="'a' holds no reservation"):
        arena.table("a", 1)


def test_fragmentation_on_a_hand_made_case():
    arena = fragmented_arena()
    arena.reserve("d", 10)  # holes of 20 at 10 and 20 at 80
    assert arena.free_slots == 40 and arena.largest_hole == 20
    assert arena.external_fragmentation == pytest.approx(0.5)
    before = arena.reservations()
    message = "no hole fits 25 slots: the largest hole is 20 although 40 slots are free"
    with pytest.raises(ArenaFullError, match=message):
        arena.reserve("f", 25)
    with pytest.raises(ArenaFullError, match="asked for 50 slots, only 40 free of 100"):
        arena.reserve("f", 50)
    assert arena.reservations() == before  # failed reservations change nothing


def test_fragmentation_is_zero_when_empty_or_full():
    arena = FirstFitArena(10)
    assert arena.external_fragmentation == 0.0
    arena.reserve("x", 10)
    assert (arena.free_slots, arena.largest_hole, arena.external_fragmentation, arena.holes()) == (0, 0, 0.0, [])


def test_arena_misuse():
    arena = FirstFitArena(10)
    arena.reserve("x", 3)
    with pytest.raises(ValueError, match="'x' already holds a reservation"):
        arena.reserve("x", 3)
    with pytest.raises(ValueError, match="size must be >= 1"):
        arena.reserve("y", 0)
    with pytest.raises(KeyError, match="'y' holds no reservation"):
        arena.free("y")


def test_cache_shapes_sizes_and_waste():
    cache = ContiguousKVCache(2, num_kv_heads=2, head_dim=8, max_seq_len=16, max_seqs=3)
    assert cache.k.shape == (2, 48, 2, 8) and cache.nbytes() == 2 * 2 * 48 * 2 * 8 * 4
    assert [cache.add_sequence(s) for s in "abc"] == [0, 16, 32]
    with pytest.raises(ArenaFullError, match="asked for 16 slots, only 0 free of 48"):
        cache.add_sequence("d")
    cache.remove_sequence("b")
    assert cache.add_sequence("d", reserve=4) == 16  # a shorter reservation fits the freed buffer
    assert cache.stats() == ContiguousStats(reserved_slots=36, used_slots=0)
    assert cache.reservations() == {"a": (0, 16), "d": (16, 4), "c": (32, 16)}
    assert cache.can_reserve(12) and not cache.can_reserve(13) and not cache.can_reserve()
    with pytest.raises(ValueError, match="exactly one of max_seqs and num_slots"):
        ContiguousKVCache(1, 1, 8, max_seq_len=16, max_seqs=2, num_slots=64)
    assert ContiguousKVCache(1, 1, 8, max_seq_len=16, num_slots=40).arena.num_slots == 40


def test_waste_pct():
    assert ContiguousStats(reserved_slots=48, used_slots=15).waste_pct == pytest.approx(68.75)
    assert ContiguousStats(reserved_slots=0, used_slots=0).waste_pct == 0.0
