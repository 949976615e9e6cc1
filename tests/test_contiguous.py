"""Stage 0: the first-fit arena, the contiguous KV cache and its attention backend."""

from __future__ import annotations

import pytest
import torch

from minipaged.attention.reference import varlen_attention
from minipaged.kv.contiguous import (
    ArenaFullError,
    ContiguousBackend,
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


def test_backend_matches_varlen_attention_for_prefill_then_decode():
    torch.manual_seed(0)
    num_layers, heads, kv_heads, head_dim, decode_steps = 2, 4, 2, 8, 3
    prompts = [5, 1, 9]
    seqs = ["a", "b", "c"]
    cache = ContiguousKVCache(num_layers, kv_heads, head_dim, max_seq_len=16, num_slots=64)
    cache.add_sequence("spacer", reserve=5)  # so no sequence starts at slot 0
    for s in seqs:
        cache.add_sequence(s)
    cache.remove_sequence("spacer")
    backend = ContiguousBackend(cache)
    total = [p + decode_steps for p in prompts]
    # Each sequence's q/k/v for every position and layer, as a model would produce them.
    q = [torch.randn(num_layers, n, heads, head_dim) for n in total]
    k = [torch.randn(num_layers, n, kv_heads, head_dim) for n in total]
    v = [torch.randn(num_layers, n, kv_heads, head_dim) for n in total]

    def pack(per_seq: list[torch.Tensor], layer: int, ranges: list[tuple[int, int]]) -> torch.Tensor:
        return torch.cat([t[layer, lo:hi] for t, (lo, hi) in zip(per_seq, ranges, strict=True)])

    def step(lo: list[int], hi: list[int]) -> None:
        """New tokens lo[i] .. hi[i] - 1 of each sequence; compare with no-cache attention over 0 .. hi[i] - 1."""
        backend.set_batch(seqs, [h - lo_ for lo_, h in zip(lo, hi, strict=True)], hi)
        new, whole = list(zip(lo, hi, strict=True)), [(0, h) for h in hi]
        cu = torch.tensor([0, *hi]).cumsum(0)
        for layer in range(num_layers):
            got = backend.attend(layer, pack(q, layer, new), pack(k, layer, new), pack(v, layer, new))
            full = varlen_attention(pack(q, layer, whole), pack(k, layer, whole), pack(v, layer, whole), cu)
            want = torch.cat([full[cu[i] + lo_ : cu[i + 1]] for i, lo_ in enumerate(lo)])
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    step([0, 0, 0], prompts)  # prefill
    assert cache.stats() == ContiguousStats(reserved_slots=48, used_slots=15)
    for j in range(decode_steps):
        step([p + j for p in prompts], [p + j + 1 for p in prompts])
    assert cache.stats().used_slots == sum(total)
    assert cache.stats().waste_pct == pytest.approx(50.0)
    with pytest.raises(ValueError, match="got 2 tokens, set_batch announced 3"):
        backend.attend(0, torch.zeros(2, heads, head_dim), torch.zeros(2, kv_heads, head_dim),
                       torch.zeros(2, kv_heads, head_dim))


def test_overflowing_a_reservation_is_refused_before_any_write():
    cache = ContiguousKVCache(1, num_kv_heads=1, head_dim=4, max_seq_len=16, num_slots=32)
    cache.add_sequence("small", reserve=4)
    cache.add_sequence("neighbour")
    backend = ContiguousBackend(cache)
    with pytest.raises(ReservationExceededError, match="sequence 'small' needs 5 slots but reserved only 4"):
        backend.set_batch(["small"], [5], [5])
    with pytest.raises(ReservationExceededError, match="needs 6 slots but reserved only 4"):
        cache.write(0, "small", 2, torch.ones(4, 1, 4), torch.ones(4, 1, 4))
    assert cache.k.abs().sum() == 0 and cache.stats().used_slots == 0  # the neighbour's buffer is intact
    with pytest.raises(ValueError, match=r"need 0 <= q_len \(3\) <= context_len \(2\)"):
        backend.set_batch(["small"], [3], [2])
