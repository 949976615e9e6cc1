"""Stage 0 exercises: ``kv_bytes_per_token`` and ``BestFitArena`` (notebook 00)."""

from __future__ import annotations

import random
from collections import deque

import pytest
import torch

from minipaged.kv.contiguous import ArenaFullError, ContiguousKVCache, FirstFitArena
from minipaged.model.config import ModelConfig
from minipaged.model.loader import EMBEDDED_MODEL_DIR
from minipaged.sim import synthetic_trace

STAGE = "stage0_contiguous"


def config(layers: int, heads: int, kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(
        model_type="llama",
        vocab_size=100,
        hidden_size=heads * head_dim,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
    )


# (name, config): the embedded model, OPT-13B (no GQA), a Llama-3-8B-like GQA model, MQA
CONFIGS = [
    ("embedded", ModelConfig.from_json(EMBEDDED_MODEL_DIR / "config.json")),
    ("opt-13b", config(40, 40, 40, 128)),
    ("gqa 32x8", config(32, 32, 8, 128)),
    ("mqa", config(4, 8, 1, 64)),
]


@pytest.mark.exercise("kv_bytes_per_token")
def test_kv_bytes_per_token_known_values(ex):
    embedded = CONFIGS[0][1]
    assert ex.kv_bytes_per_token(embedded, torch.float32) == 1024, "embedded model in fp32: 2 x 2 x 2 x 32 x 4 bytes"
    assert ex.kv_bytes_per_token(embedded, torch.bfloat16) == 512
    assert ex.kv_bytes_per_token(CONFIGS[1][1], torch.float16) == 800 * 1024, "OPT-13B in fp16: 800 KiB per token"
    got = ex.kv_bytes_per_token(CONFIGS[2][1], torch.float16)
    assert got == 128 * 1024, f"32 layers, 8 KV heads (32 query heads) of 128 in fp16: 128 KiB, got {got}"


@pytest.mark.exercise("kv_bytes_per_token")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,cfg", CONFIGS, ids=[n for n, _ in CONFIGS])
def test_kv_bytes_per_token_matches_cache(ex, name, cfg, dtype):
    slots = 3
    cache = ContiguousKVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, max_seq_len=slots, num_slots=slots, dtype=dtype
    )
    want = cache.nbytes() // slots
    got = ex.kv_bytes_per_token(cfg, dtype)
    assert isinstance(got, int), f"return an int, got {type(got).__name__}"
    assert got == want, f"{name} in {dtype}: ContiguousKVCache holds {want} bytes per token, you computed {got}"


def _arena_with_holes(cls):
    """100 slots with holes (10, 30) and (50, 20)."""
    arena = cls(100)
    for owner, size in [("a", 10), ("b", 30), ("c", 10), ("d", 20), ("e", 30)]:
        arena.reserve(owner, size)
    arena.free("b")
    arena.free("d")
    return arena


@pytest.mark.exercise("BestFitArena")
def test_best_fit_example(ex):
    arena = _arena_with_holes(ex.BestFitArena)
    assert arena.holes() == [(10, 30), (50, 20)]
    assert _arena_with_holes(FirstFitArena).reserve("x", 15) == 10  # first fit takes the first hole
    start = arena.reserve("x", 15)
    assert start == 50, f"holes (10, 30) and (50, 20): 15 slots go in the smaller hole at 50, got {start}"
    assert arena.span("x") == (50, 15)
    assert arena.holes() == [(10, 30), (65, 5)]
    assert arena.reserve("y", 30) == 10, "only the hole at 10 fits 30 slots"
    assert arena.reserve("z", 5) == 65


@pytest.mark.exercise("BestFitArena")
def test_best_fit_ties_and_errors(ex):
    arena = ex.BestFitArena(60)
    for owner in "abcde":
        arena.reserve(owner, 10)
    arena.free("d")
    arena.free("b")  # holes (10, 10), (30, 10), (50, 10): all equal
    assert arena.reserve("x", 10) == 10, "on a tie take the lowest address"
    assert arena.reserve("y", 4) == 30
    before = (arena.reservations(), arena.holes())
    with pytest.raises(ArenaFullError):
        arena.reserve("big", 11)  # 16 slots free, but in holes of 6 and 10
    with pytest.raises(ValueError):
        arena.reserve("x", 1)  # x already holds a reservation
    with pytest.raises(ValueError):
        arena.reserve("w", 0)
    assert (arena.reservations(), arena.holes()) == before, "a failed reserve must leave the arena unchanged"


@pytest.mark.exercise("BestFitArena")
def test_best_fit_random_operations(ex):
    """Against the definition, on random reserve/free sequences: every start is the smallest fitting hole."""
    rng = random.Random(0)
    for trial in range(20):
        arena, live = ex.BestFitArena(200), []
        for op in range(60):
            if live and rng.random() < 0.4:
                arena.free(live.pop(rng.randrange(len(live))))
                continue
            size = rng.randint(1, 40)
            fitting = [(hole, start) for start, hole in arena.holes() if hole >= size]
            owner = (trial, op)
            if not fitting:
                with pytest.raises(ArenaFullError):
                    arena.reserve(owner, size)
                continue
            want = min(fitting)[1]
            got = arena.reserve(owner, size)
            assert got == want, f"holes {arena.holes()} before, size {size}: best fit starts at {want}, got {got}"
            live.append(owner)
            assert sum(s for _, s in arena.holes()) == arena.free_slots  # spans never overlap


def _replay(arena, trace):
    """Notebook 00's replay with exact reservations: mean external fragmentation, steps."""
    pending = deque(sorted(trace, key=lambda r: (r.arrival, r.request_id)))
    waiting, running, tokens, frag, t = deque(), {}, {}, [], 0
    while pending or waiting or running:
        for rid, request in list(running.items()):
            if tokens[rid] == request.total_len:
                arena.free(rid)
                del running[rid], tokens[rid]
            else:
                tokens[rid] += 1
        while pending and pending[0].arrival <= t:
            waiting.append(pending.popleft())
        while waiting:
            try:
                arena.reserve(waiting[0].request_id, waiting[0].total_len)
            except ArenaFullError:
                break
            request = waiting.popleft()
            running[request.request_id], tokens[request.request_id] = request, request.prompt_len
        frag.append(arena.external_fragmentation)
        t += 1
    return sum(frag) / len(frag), t


@pytest.mark.exercise("BestFitArena")
def test_best_fit_serves_the_trace(ex):
    """The notebook's question: replay the seeded trace with exact reservations on both arenas."""
    trace = synthetic_trace(100, seed=0, mean_prompt=128, mean_output=64, max_len=512, arrival_rate=0.5)
    first_frag, first_steps = _replay(FirstFitArena(4096), trace)
    best_frag, best_steps = _replay(ex.BestFitArena(4096), trace)
    # Both serve everything; best fit keeps big holes for big requests. On this trace it fragments
    # less and finishes no later (a property of this trace, not a theorem).
    assert 0 <= best_frag < first_frag, (best_frag, first_frag)
    assert best_steps <= first_steps, (best_steps, first_steps)
