"""Stage 3 exercises: decode / prefill slot mappings and ``gather_sequence_kv`` (notebook 03)."""

from __future__ import annotations

import random

import pytest
import torch

from minipaged.attention.reference import gather_kv, store_kvcache
from minipaged.kv.block_table import BlockTable, padded_block_tables
from minipaged.kv.slot_mapping import build_slot_mapping
from minipaged.utils import cdiv

STAGE = "stage3_slot_mapping"


def random_batch(num_seqs: int, block_size: int, seed: int, max_len: int = 40):
    """Scattered block tables from a shuffled pool, and each sequence's token count."""
    rng = random.Random(seed)
    lens = [rng.randint(1, max_len) for _ in range(num_seqs)]
    needed = [cdiv(n, block_size) for n in lens]
    ids = list(range(sum(needed) + 3))
    rng.shuffle(ids)
    tables, start = [], 0
    for k in needed:
        tables.append(ids[start : start + k])
        start += k
    return tables, lens, len(ids)


def _assert_slots(got, want: torch.Tensor, what: str) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: return a torch.Tensor, got {type(got).__name__}"
    assert got.dtype == torch.int64, f"{what}: slot_mapping is int64, got {got.dtype}"
    assert got.tolist() == want.tolist(), f"{what}: want {want.tolist()}, got {got.tolist()}"


@pytest.mark.exercise("decode_slot_mapping")
def test_decode_slot_mapping_example(ex):
    got = ex.decode_slot_mapping([[7, 3], [7, 9]], [24, 20], 16)
    _assert_slots(got, torch.tensor([3 * 16 + 7, 9 * 16 + 3]), "tables [[7, 3], [7, 9]], context_lens [24, 20]")
    _assert_slots(ex.decode_slot_mapping([[5]], [1], 16), torch.tensor([80]), "first token of block 5")


@pytest.mark.exercise("decode_slot_mapping")
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_decode_slot_mapping_matches_package(ex, block_size):
    for seed in range(4):
        tables, lens, _ = random_batch(6, block_size, seed)
        want = build_slot_mapping(tables, [n - 1 for n in lens], lens, block_size)  # one new token each
        _assert_slots(
            ex.decode_slot_mapping(tables, lens, block_size),
            want,
            f"lists, block size {block_size}, tables {tables}, context_lens {lens}",
        )
        engine_form = (padded_block_tables(tables), torch.tensor(lens, dtype=torch.int32))
        _assert_slots(
            ex.decode_slot_mapping(*engine_form, block_size),
            want,
            f"int32 tensors (padded_block_tables), block size {block_size}",
        )


@pytest.mark.exercise("prefill_slot_mapping")
def test_prefill_slot_mapping_example(ex):
    got = ex.prefill_slot_mapping([[2], [0, 5]], [3, 6], 4, pad_to=10)
    _assert_slots(got, torch.tensor([8, 9, 10, 0, 1, 2, 3, 20, 21, -1]), "tables [[2], [0, 5]], prompt_lens [3, 6]")
    _assert_slots(
        ex.prefill_slot_mapping([[2], [0, 5]], [3, 6], 4, pad_to=9),
        torch.tensor([8, 9, 10, 0, 1, 2, 3, 20, 21]),
        "no padding",
    )
    with pytest.raises(ValueError):
        ex.prefill_slot_mapping([[2], [0, 5]], [3, 6], 4, pad_to=8)


@pytest.mark.exercise("prefill_slot_mapping")
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_prefill_slot_mapping_matches_package(ex, block_size):
    for seed in range(4):
        tables, lens, _ = random_batch(5, block_size, 10 + seed)
        pad_to = sum(lens) + seed * 3
        want = build_slot_mapping(tables, [0] * len(lens), lens, block_size)
        want = torch.cat([want, torch.full((pad_to - sum(lens),), -1, dtype=torch.int64)])
        _assert_slots(
            ex.prefill_slot_mapping(tables, lens, block_size, pad_to),
            want,
            f"block size {block_size}, tables {tables}, prompt_lens {lens}, pad_to {pad_to}",
        )


@pytest.mark.exercise("prefill_slot_mapping")
def test_prefill_slot_mapping_writes_the_pool(ex):
    """The mapping in use: store_kvcache writes every prompt token where gather_kv finds it; padding writes nothing."""
    block_size, kv_heads, head_dim = 4, 2, 8
    tables, lens, num_blocks = random_batch(3, block_size, seed=5, max_len=15)
    pad_to = sum(lens) + 5
    g = torch.Generator().manual_seed(0)
    key = torch.randn(pad_to, kv_heads, head_dim, generator=g)  # the padding rows hold garbage
    value = torch.randn(pad_to, kv_heads, head_dim, generator=g)
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    store_kvcache(key, value, k_cache, v_cache, ex.prefill_slot_mapping(tables, lens, block_size, pad_to))
    start = 0
    for table, n in zip(tables, lens):
        ids = torch.tensor(table)
        assert torch.equal(gather_kv(k_cache, ids, n), key[start : start + n]), "keys landed in the wrong slots"
        assert torch.equal(gather_kv(v_cache, ids, n), value[start : start + n])
        start += n
    written = sum(lens) * kv_heads * head_dim
    assert int((k_cache != 0).sum()) == written, "padding tokens must write nothing (slot -1)"


@pytest.mark.exercise("gather_sequence_kv")
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_gather_sequence_kv_matches_gather_kv(ex, block_size):
    g = torch.Generator().manual_seed(block_size)
    tables, lens, num_blocks = random_batch(4, block_size, seed=20 + block_size)
    cache = torch.randn(num_blocks, block_size, 2, 8, generator=g)
    for table, n in zip(tables, lens):
        want = gather_kv(cache, torch.tensor(table), n)
        for form in (table, torch.tensor(table, dtype=torch.int32)):
            got = ex.gather_sequence_kv(cache, form, n)
            assert tuple(got.shape) == tuple(want.shape), f"shape: want {tuple(want.shape)}, got {tuple(got.shape)}"
            assert torch.equal(got, want), f"block size {block_size}, table {table}, {n} tokens: differs from gather_kv"


@pytest.mark.exercise("gather_sequence_kv")
def test_gather_sequence_kv_reads_what_the_engine_wrote(ex):
    """Grow block tables as the engine does, write by slot, read back with your gather."""
    from minipaged.kv.block_pool import BlockPool

    block_size, pool = 4, BlockPool(16)
    shuffled = pool.allocate(16)
    random.Random(3).shuffle(shuffled)
    for block in shuffled:
        pool.free([block])
    tables = [BlockTable(block_size) for _ in range(3)]
    cache = torch.zeros(16, block_size, 1, 2)
    written = {i: [] for i in range(3)}
    for step in range(12):  # three sequences decode in turn, one token each
        i = step % 3
        table = tables[i]
        table.append_tokens(1 + (step == i), pool)  # the first visit brings two tokens
        n = table.num_tokens
        new = torch.full((n - len(written[i]), 1, 2), float(10 * i + step))
        slots = build_slot_mapping([table.block_ids], [len(written[i])], [n], block_size)
        store_kvcache(new, new, cache, cache.clone(), slots)
        written[i] += [float(10 * i + step)] * new.shape[0]
    for i, table in enumerate(tables):
        got = ex.gather_sequence_kv(cache, table.block_ids, table.num_tokens)
        assert got[:, 0, 0].tolist() == written[i], f"sequence {i}, table {table.block_ids}"
