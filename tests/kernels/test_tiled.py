"""minipaged.kernels.tiled: the kernel's walk and online softmax in torch, against the reference and the kernel."""

from __future__ import annotations

import pytest
import torch

from minipaged.attention.reference import causal_attention, gather_kv
from minipaged.kernels.tiled import (
    M_START,
    OnlineSoftmax,
    kernel_tile_sizes,
    kv_tiles,
    online_softmax_trace,
    program_reads,
    query_tile,
    tile_kv_end,
    tiled_attention,
)


def test_query_tiles_and_where_their_walk_stops():
    assert list(query_tile(12, 1, 5)) == [5, 6, 7, 8, 9]
    assert list(query_tile(12, 2, 5)) == [10, 11]  # cut at q_len
    assert list(query_tile(5, 3, 4)) == []  # past the sequence's queries: the program returns
    # 20 cached tokens, 12 of them new (positions 8..19), tiles of 4 queries: tile 0 sees keys 0..11
    assert [tile_kv_end(20, 12, t, 4) for t in range(3)] == [12, 16, 20]
    assert tile_kv_end(57, 1, 0, 1) == 57  # a decode sees its whole context
    for context_len, q_len, block_q in ((9, 5, 4), (100, 100, 16), (33, 7, 1)):
        for t in range(-(-q_len // block_q)):
            last_query = query_tile(q_len, t, block_q)[-1]
            assert tile_kv_end(context_len, q_len, t, block_q) == context_len - q_len + last_query + 1


def test_kv_tiles_cover_each_position_once():
    assert kv_tiles(20, 8) == [range(0, 8), range(8, 16), range(16, 20)]
    assert kv_tiles(0, 8) == []
    with pytest.raises(ValueError, match="block_n"):
        kv_tiles(4, 0)


def test_program_reads_steps():
    table, ctx, bs, bn = [6, 2, 9, 0, 4], 20, 4, 8
    steps = program_reads(table, ctx, bs, bn)
    assert [[r.physical for r in s] for s in steps] == [[6, 2], [9, 0], [4]]
    assert [[r.logical for r in s] for s in steps] == [[0, 1], [2, 3], [4]]
    assert sum(r.num_positions for s in steps for r in s) == ctx  # every position read exactly once
    # a prefill query tile stops at its last query: kv_end 12 -> two steps, the last one reading one block
    assert [[phys for _, phys, _ in s] for s in program_reads(table, ctx, bs, bn, kv_end=12)] == [[6, 2], [9]]
    # block_n smaller than a block: one block is read over several steps
    assert program_reads([3], 4, 4, 2) == [[(0, 3, 2)], [(0, 3, 2)]]
    # a tile that starts mid-block reads the rest of it
    assert program_reads([5, 7], 8, 4, 3) == [[(0, 5, 3)], [(0, 5, 1), (1, 7, 2)], [(1, 7, 2)]]
    with pytest.raises(ValueError, match="need 2 blocks"):
        program_reads([1], 5, 4, 8)
    with pytest.raises(ValueError, match="kv_end"):
        program_reads([1, 2], 5, 4, 8, kv_end=6)


def test_online_softmax_trace_equals_softmax():
    scores = torch.randn(37, generator=torch.Generator().manual_seed(0)) * 3
    tr = online_softmax_trace(scores.tolist(), 8)
    assert len(tr["m"]) == len(tr["l"]) == len(tr["alpha"]) == 5
    assert bool((tr["m"].diff() >= 0).all())  # the running max never decreases
    assert tr["m"][-1] == pytest.approx(scores.max().item())
    assert tr["alpha"][0] == 0  # nothing summed before the first tile
    assert tr["l"][-1] == pytest.approx(torch.exp(scores.double() - scores.max()).sum().item())
    torch.testing.assert_close(tr["p_online"], torch.softmax(scores.double(), 0), rtol=0, atol=1e-12)
    torch.testing.assert_close(tr["p_full"], torch.softmax(scores.double(), 0))


def test_online_softmax_rescales_when_the_max_rises():
    tr = online_softmax_trace([0.0, 1.0, 3.0, 2.0], 2)  # tile 1 raises the max from 1 to 3
    assert tr["m"].tolist() == [1.0, 3.0]
    assert tr["alpha"][1].item() == pytest.approx(torch.exp(torch.tensor(-2.0, dtype=torch.float64)).item())
    with pytest.raises(ValueError):
        online_softmax_trace([], 4)


def test_online_softmax_fully_masked_tile_changes_nothing():
    state = OnlineSoftmax.start(2, 3)
    alpha = state.update(torch.tensor([[float("-inf")] * 4, [1.0, 2.0, 0.0, -1.0]]), torch.ones(4, 3))
    assert not torch.isnan(alpha).any() and not torch.isnan(state.acc).any()
    assert state.m[0] == M_START and state.l[0] == 0 and state.acc[0].abs().sum() == 0
    assert state.output()[0].abs().sum() == 0  # a row that saw nothing gives 0, not NaN
    torch.testing.assert_close(state.output()[1], torch.ones(3))  # softmax weights sum to 1


def _paged(context_len, num_kv_heads, head_dim, block_size, seed):
    """A random paged cache and a shuffled block table holding one sequence's K/V."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = -(-context_len // block_size) + 3
    table = torch.randperm(num_blocks, generator=g)[: -(-context_len // block_size)]
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    return k_cache, v_cache, table, g


@pytest.mark.parametrize(
    "q_len, context_len, block_size, block_q, block_n",
    [(1, 37, 4, 1, 16), (12, 20, 4, 4, 8), (9, 9, 16, 16, 4), (5, 40, 8, 2, 3), (30, 30, 1, 8, 256)],
)
def test_tiled_attention_equals_the_reference(q_len, context_len, block_size, block_q, block_n):
    num_heads, num_kv_heads, head_dim = 8, 2, 16
    k_cache, v_cache, table, g = _paged(context_len, num_kv_heads, head_dim, block_size, seed=q_len + context_len)
    q = torch.randn(q_len, num_heads, head_dim, generator=g)
    got = tiled_attention(q, k_cache, v_cache, table, context_len, block_q, block_n)
    want = causal_attention(q, gather_kv(k_cache, table, context_len), gather_kv(v_cache, table, context_len))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_tiled_attention_rejects_bad_input():
    k_cache, v_cache, table, _ = _paged(8, 1, 4, 4, seed=0)
    with pytest.raises(ValueError, match="context_len"):
        tiled_attention(torch.zeros(9, 1, 4), k_cache, v_cache, table, 8, 1, 4)
    with pytest.raises(ValueError, match="blocks"):
        tiled_attention(torch.zeros(2, 1, 4), k_cache, v_cache, table[:1], 8, 1, 4)


def test_kernel_tile_sizes_are_the_kernels():
    pytest.importorskip("triton")
    from minipaged.kernels.paged_attention import kernel_constexprs

    for decode, max_q_len, block_m in ((True, 1, None), (False, 12, 16), (False, 300, None)):
        consts = kernel_constexprs(torch.float32, 8, 2, 32, max_q_len, decode, block_m, 16)
        assert kernel_tile_sizes(torch.float32, 8, 2, 32, max_q_len, decode, block_m, 16) == (
            consts["BLOCK_Q"],
            consts["BLOCK_N"],
        )
    assert kernel_tile_sizes(torch.float32, 8, 2, 32, 1, True)[0] == 1  # decode: one query token per program


@pytest.mark.slow
def test_tiled_attention_with_the_kernels_tiles_matches_the_kernel():
    """Notebook 04's batch: the Triton kernel (tiles 16 x 16) and this module, sequence by sequence."""
    pytest.importorskip("triton")
    from minipaged.kernels import paged_prefill_attention

    num_heads, num_kv_heads, head_dim, block_size = 8, 2, 32, 4
    q_lens, context_lens = [5, 12, 1], [9, 20, 7]
    tables = [[1, 8, 11], [6, 2, 9, 0, 4], [3, 10]]
    g = torch.Generator().manual_seed(1)
    k_cache = torch.randn(12, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(12, block_size, num_kv_heads, head_dim, generator=g)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=g)
    block_tables = torch.tensor([t + [0] * (5 - len(t)) for t in tables], dtype=torch.int32)
    cu = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
    ctx = torch.tensor(context_lens, dtype=torch.int32)
    kernel = paged_prefill_attention(q, k_cache, v_cache, block_tables, cu, ctx, block_m=16, block_n=16)
    block_q, block_n = kernel_tile_sizes(torch.float32, num_heads, num_kv_heads, head_dim, max(q_lens), False, 16, 16)
    assert (block_q, block_n) == (4, 16)  # 16 rows = 4 tokens x 4 query heads per KV head
    for i, (table, context_len) in enumerate(zip(tables, context_lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        got = tiled_attention(q[rows], k_cache, v_cache, table, context_len, block_q, block_n)
        torch.testing.assert_close(got, kernel[rows], rtol=1e-5, atol=1e-5)
