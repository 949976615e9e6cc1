"""Stage 2 exercises: ``physical`` and ``gather`` (notebook 02)."""

from __future__ import annotations

import random

import pytest
import torch

from minipaged.attention.reference import gather_kv
from minipaged.kv.block_table import BlockTable
from minipaged.utils import cdiv

STAGE = "stage2_block_table"


@pytest.mark.exercise("physical")
def test_physical_seed_example(ex):
    for pos, want in [(0, (7, 0)), (15, (7, 15)), (16, (3, 0)), (23, (3, 7)), (31, (3, 15))]:
        got = ex.physical([7, 3], 16, pos)
        assert tuple(got) == want, f"table [7, 3], block size 16, position {pos}: want {want}, got {got}"
    with pytest.raises(IndexError):
        ex.physical([7, 3], 16, 32)  # past the last block
    with pytest.raises(IndexError):
        ex.physical([7, 3], 16, 100)


@pytest.mark.exercise("physical")
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_physical_matches_block_table(ex, block_size):
    rng = random.Random(block_size)
    ids = rng.sample(range(50), 7)
    table = BlockTable.from_blocks(ids, len(ids) * block_size, block_size)  # every block full
    for pos in range(len(ids) * block_size):
        got = ex.physical(ids, block_size, pos)
        assert tuple(got) == table.physical(pos), f"table {ids}, block size {block_size}, position {pos}"
    with pytest.raises(IndexError):
        ex.physical(ids, block_size, len(ids) * block_size)
    with pytest.raises(IndexError):
        ex.physical([], block_size, 0)


def _scattered_case(block_size: int, num_tokens: int, seed: int):
    """A cache of random numbers and a shuffled block table that holds ``num_tokens`` tokens."""
    g = torch.Generator().manual_seed(seed)
    needed = cdiv(num_tokens, block_size)
    num_blocks = needed + 5
    cache = torch.randn(num_blocks, block_size, 2, 8, generator=g)
    ids = random.Random(seed).sample(range(num_blocks), needed)
    return cache, ids


@pytest.mark.exercise("gather")
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_gather_matches_gather_kv(ex, block_size):
    for seed, num_tokens in enumerate([1, block_size, 2 * block_size + 1, 37]):
        cache, ids = _scattered_case(block_size, num_tokens, seed)
        want = gather_kv(cache, torch.tensor(ids), num_tokens)
        for table in (ids, torch.tensor(ids, dtype=torch.int32)):
            got = ex.gather(cache, table, num_tokens)
            assert got.shape == want.shape, f"shape: want {tuple(want.shape)}, got {tuple(got.shape)}"
            assert got.dtype == cache.dtype
            mismatch = (got != want).any(dim=(1, 2)).nonzero().flatten().tolist()
            assert not mismatch, (
                f"block size {block_size}, table {ids}, {num_tokens} tokens: rows {mismatch[:5]} differ from gather_kv"
            )


@pytest.mark.exercise("gather")
def test_gather_edges(ex):
    cache, ids = _scattered_case(4, 10, seed=7)
    longer = ids + [0, 1]  # a table may be longer than the tokens need (padded block tables are)
    assert torch.equal(ex.gather(cache, longer, 10), gather_kv(cache, torch.tensor(longer), 10))
    empty = ex.gather(cache, ids, 0)
    assert tuple(empty.shape) == (0, 2, 8), f"0 tokens: shape (0, 2, 8), got {tuple(empty.shape)}"
    bf16 = cache.to(torch.bfloat16)
    assert torch.equal(ex.gather(bf16, ids, 10), gather_kv(bf16, torch.tensor(ids), 10))
    got = ex.gather(cache, ids, 10)
    got.zero_()
    assert cache.abs().sum() > 0, "return a new tensor: writing to it must not change the cache"
