"""Stage 4: the Triton kernels against the torch reference.

Without a GPU the kernels run in Triton's interpreter (slow: its cost grows with programs x
loop steps), so the grid is a covering selection, not the full cross product:

- every (block_size, head_dim, (num_heads, num_kv_heads)) combination (3 x 2 x 3 = 18) runs one
  decode batch holding every decode length pair and one prefill batch holding every prefill
  pair plus a decode-shaped and an empty sequence;
- dtype and block-table kind rotate over those 18 so that every dtype meets every table kind,
  block size, head_dim and head layout (a Latin-square assignment);
- a third of the cases run the GPU's default tiles (64 query rows x 64 keys), the rest the
  interpreter's (128 x 256), so both the launch configs the package uses are checked.

Tolerances: fp32 1e-4 (the kernel and the reference both compute in fp32); fp16 and bf16 are
one or two units in the last place of the output dtype, plus what a GPU adds by feeding P to
``tl.dot`` in that dtype: fp16 atol 2e-3 / rtol 1e-2, bf16 atol 2e-2 / rtol 2e-2.

On a CUDA machine the same tests run the compiled kernels on the GPU. What depends on import
order, the environment or a fresh interpreter (and the ahead-of-time GPU compile) is in
``tests/kernels/test_kernels_fresh_process.py``.
"""

from __future__ import annotations

import ctypes
import itertools
import os

import pytest
import torch

from minipaged import kernels
from minipaged.attention import reference
from minipaged.utils import cdiv

DEVICE = "cpu" if kernels.INTERPRET else "cuda"

BLOCK_SIZES = (8, 16, 32)
HEAD_DIMS = (64, 128)
HEADS = ((4, 4), (8, 2), (5, 1))
DECODE_PAIRS = ((1, 1), (1, 37), (1, 523))
PREFILL_PAIRS = ((5, 18), (129, 463))
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TABLE_KINDS = ("random", "scattered", "repeated")
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 1e-2), torch.bfloat16: (2e-2, 2e-2)}
PAD_ID = 999_999  # table entries past a sequence's blocks: never read, so any value must do


@pytest.fixture(autouse=True, scope="module")
def _single_threaded_blas():
    """The interpreter's tl.dot is numpy.matmul; a threaded OpenBLAS on busy cores ran it ~5x
    slower than one thread here. Best effort, for this module only: numpy's bundled OpenBLAS."""
    found = []
    if kernels.INTERPRET and os.path.exists("/proc/self/maps"):
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps if "openblas" in line.lower() and line.rstrip().endswith(".so")}
        for path in sorted(libs):
            lib = ctypes.CDLL(path)
            for prefix in ("scipy_openblas", "openblas"):
                for suffix in ("64_", ""):
                    get, put = (getattr(lib, f"{prefix}_{op}_num_threads{suffix}", None) for op in ("get", "set"))
                    if get is not None and put is not None and not found:
                        found.append((put, get()))
                        put(1)
    yield
    for put, before in found:
        put(before)


def _covering_grid() -> list:
    cases = []
    for (a, bs), (c, hd), (b, heads) in itertools.product(
        enumerate(BLOCK_SIZES), enumerate(HEAD_DIMS), enumerate(HEADS)
    ):
        # (a + b, a + 2b) mod 3 is a bijection of (a, b): every (dtype, table) pair occurs for each head_dim.
        dtype = DTYPES[(a + b + c) % 3]
        table = TABLE_KINDS[(a + 2 * b + c) % 3]
        # A third of the cases use the GPU's default tiles (64 x 64); the rest the interpreter's (128 x 256).
        tiles = (64, 64) if (a + 2 * b + 2 * c) % 3 == 0 else (None, None)
        name = f"bs{bs}-d{hd}-h{heads[0]}x{heads[1]}-{str(dtype)[6:]}-{table}-{'gpu' if tiles[0] else 'cpu'}tiles"
        cases.append(pytest.param(bs, hd, heads, dtype, table, tiles, id=name))
    return cases


def _tables(kind: str, ctx_lens: list[int], block_size: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """int32 block tables for sequences of ``ctx_lens`` tokens, and the pool size they index.

    random: distinct ids in random order; scattered: distinct ids strided across a pool 3x the
    need, from the top block down to block 0; repeated: ids drawn with replacement from 3
    blocks (blocks shared within and across sequences, as prefix sharing and copies do).
    """
    need = [cdiv(n, block_size) for n in ctx_lens]
    total = sum(need)
    if kind == "random":
        num_blocks = total + 5
        ids = torch.randperm(num_blocks, generator=gen)[:total]
    elif kind == "scattered":
        num_blocks = 3 * total + 1
        ids = torch.arange(num_blocks - 1, -1, -3)[:total]
    else:
        num_blocks = 3
        ids = torch.randint(0, num_blocks, (total,), generator=gen)
    width = max(need, default=0) + 2
    tables = torch.full((len(ctx_lens), width), PAD_ID, dtype=torch.int32)
    start = 0
    for i, n in enumerate(need):
        tables[i, :n] = ids[start : start + n].int()
        start += n
    return tables, num_blocks


def _batch(pairs, block_size, head_dim, heads, dtype, table_kind, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads = heads
    q_lens = [p[0] for p in pairs]
    ctx_lens = [p[1] for p in pairs]
    tables, num_blocks = _tables(table_kind, ctx_lens, block_size, gen)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen).to(dtype)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32)
    ctx = torch.tensor(ctx_lens, dtype=torch.int32)
    return [t.to(DEVICE) for t in (q, k_cache, v_cache, tables, cu, ctx)]


def _assert_close(out, ref, dtype):
    atol, rtol = TOLERANCE[dtype]
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("block_size,head_dim,heads,dtype,table_kind,tiles", _covering_grid())
@pytest.mark.slow
def test_decode_matches_reference(block_size, head_dim, heads, dtype, table_kind, tiles):
    q, k_cache, v_cache, tables, _, ctx = _batch(DECODE_PAIRS, block_size, head_dim, heads, dtype, table_kind)
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, ctx, block_n=tiles[1])
    ref = reference.paged_decode_attention(q, k_cache, v_cache, tables, ctx)
    _assert_close(out, ref, dtype)


@pytest.mark.parametrize("block_size,head_dim,heads,dtype,table_kind,tiles", _covering_grid())
@pytest.mark.slow
def test_prefill_matches_reference(block_size, head_dim, heads, dtype, table_kind, tiles):
    pairs = (*PREFILL_PAIRS, (0, 7), (1, 37))  # an empty sequence, and a decode-shaped one
    q, k_cache, v_cache, tables, cu, ctx = _batch(pairs, block_size, head_dim, heads, dtype, table_kind, seed=1)
    out = kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, ctx, block_m=tiles[0], block_n=tiles[1])
    ref = reference.paged_prefill_attention(q, k_cache, v_cache, tables, cu, ctx)
    _assert_close(out, ref, dtype)


@pytest.mark.slow
def test_small_tiles_and_blocks_longer_than_a_tile():
    """block_m = block_n = 16 with 32-token blocks: a KV tile is half a block, query tiles are
    short, so tile and block boundaries fall everywhere; a custom scale too."""
    pairs = ((40, 100), (3, 3), (17, 64))
    q, k_cache, v_cache, tables, cu, ctx = _batch(pairs, 32, 64, (8, 2), torch.float32, "random", seed=2)
    out = kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, ctx, 0.3, block_m=16, block_n=16)
    ref = reference.paged_prefill_attention(q, k_cache, v_cache, tables, cu, ctx, 0.3)
    _assert_close(out, ref, torch.float32)


def test_head_dim_not_a_power_of_two_and_strided_q():
    """head_dim 80 runs padded to 128 with masked lanes; q is a strided view (a slice of a fused
    qkv projection), as a model passes it."""
    pairs = ((1, 50), (1, 9))
    q, k_cache, v_cache, tables, _, ctx = _batch(pairs, 16, 80, (4, 2), torch.float32, "random", seed=3)
    qkv = torch.randn(q.shape[0], 3 * q.shape[1], 80, device=DEVICE)
    qkv[:, : q.shape[1]] = q
    q_view = qkv[:, : q.shape[1]]
    assert not q_view.is_contiguous()
    out = kernels.paged_decode_attention(q_view, k_cache, v_cache, tables, ctx)
    _assert_close(out, reference.paged_decode_attention(q, k_cache, v_cache, tables, ctx), torch.float32)


def test_decode_is_prefill_with_one_query_per_sequence():
    q, k_cache, v_cache, tables, cu, ctx = _batch(((1, 30), (1, 1), (1, 64)), 8, 64, (8, 2), torch.float32, "random")
    decode = kernels.paged_decode_attention(q, k_cache, v_cache, tables, ctx)
    prefill = kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, ctx)
    torch.testing.assert_close(decode, prefill, atol=1e-6, rtol=1e-6)


def test_empty_batches():
    q, k_cache, v_cache, tables, cu, ctx = _batch(((0, 5), (0, 0)), 8, 64, (4, 4), torch.float32, "random")
    assert kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, ctx).shape == (0, 4, 64)
    none = torch.zeros(0, 4, 64, device=DEVICE)
    empty_tables = torch.zeros(0, 1, dtype=torch.int32, device=DEVICE)
    empty_lens = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    assert kernels.paged_decode_attention(none, k_cache, v_cache, empty_tables, empty_lens).shape == (0, 4, 64)


def test_invalid_inputs_raise_clear_errors():
    q, k_cache, v_cache, tables, cu, ctx = _batch(((2, 10), (1, 4)), 8, 64, (4, 2), torch.float32, "random")
    prefill = kernels.paged_prefill_attention
    with pytest.raises(ValueError, match="block_tables must be int32"):
        prefill(q, k_cache, v_cache, tables.long(), cu, ctx)
    with pytest.raises(ValueError, match="context_lens must be int32"):
        prefill(q, k_cache, v_cache, tables, cu, ctx.long())
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32"):
        prefill(q, k_cache, v_cache, tables, cu[:-1], ctx)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        prefill(q[:, :3], k_cache, v_cache, tables, cu, ctx)
    with pytest.raises(ValueError, match="share one of"):
        prefill(q.half(), k_cache, v_cache, tables, cu, ctx)
    with pytest.raises(ValueError, match="head_dim"):
        prefill(q[..., :32], k_cache, v_cache, tables, cu, ctx)
    with pytest.raises(ValueError, match="one query per sequence"):
        kernels.paged_decode_attention(q, k_cache, v_cache, tables, ctx)
    if DEVICE == "cpu":  # value checks need a host sync: they run off CUDA only
        with pytest.raises(ValueError, match="context_len 1 < its 2"):
            prefill(q, k_cache, v_cache, tables, cu, torch.tensor([1, 4], dtype=torch.int32))
        with pytest.raises(ValueError, match="ids outside"):
            prefill(q, k_cache, v_cache, tables + 1000, cu, ctx)
        with pytest.raises(ValueError, match="exceeds the block table"):
            prefill(q, k_cache, v_cache, tables[:, :1], cu, ctx)


# --- store_kvcache ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_kv_heads,head_dim,src_dtype,cache_dtype",
    [
        (2, 64, torch.float32, torch.float32),
        (5, 128, torch.float16, torch.float16),
        (1, 80, torch.float32, torch.bfloat16),
    ],
)
def test_store_kvcache_matches_torch(num_kv_heads, head_dim, src_dtype, cache_dtype):
    gen = torch.Generator().manual_seed(4)
    num_blocks, block_size, num_tokens = 9, 16, 37
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::5] = -1  # padding tokens write nothing
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(src_dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(src_dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_ref, v_ref = torch.randn(shape, generator=gen).to(cache_dtype), torch.randn(shape, generator=gen).to(cache_dtype)
    k_cache, v_cache = k_ref.clone().to(DEVICE), v_ref.clone().to(DEVICE)
    kernels.store_kvcache(key.to(DEVICE), value.to(DEVICE), k_cache, v_cache, slots.to(DEVICE))
    reference.store_kvcache(key, value, k_ref, v_ref, slots)
    assert torch.equal(k_cache.cpu(), k_ref) and torch.equal(v_cache.cpu(), v_ref)


def test_store_kvcache_skips_minus_one_and_reads_strided_inputs():
    k_cache = torch.zeros(4, 8, 2, 64, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    kv = torch.randn(3, 4, 64, device=DEVICE)  # fused k|v heads: key and value are strided views
    key, value = kv[:, :2], kv[:, 2:]
    kernels.store_kvcache(key, value, k_cache, v_cache, torch.tensor([-1, 9, -1], device=DEVICE))
    assert torch.equal(k_cache.view(-1, 2, 64)[9], key[1]) and torch.equal(v_cache.view(-1, 2, 64)[9], value[1])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 1  # only slot 9 written
    kernels.store_kvcache(key[:0], value[:0], k_cache, v_cache, torch.zeros(0, dtype=torch.long, device=DEVICE))


def test_store_kvcache_rejects_bad_input():
    k_cache = torch.zeros(2, 4, 1, 64, device=DEVICE)
    key = torch.zeros(2, 1, 64, device=DEVICE)
    with pytest.raises(ValueError, match="slot_mapping must be int64"):
        kernels.store_kvcache(key, key, k_cache, k_cache.clone(), torch.zeros(2, device=DEVICE))
    with pytest.raises(ValueError, match="num_kv_heads, head_dim"):
        kernels.store_kvcache(key[..., :32], key[..., :32], k_cache, k_cache.clone(), torch.zeros(2, dtype=torch.long))
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="outside"):
            kernels.store_kvcache(key, key, k_cache, k_cache.clone(), torch.tensor([0, 8]))


def test_backend_uses_the_kernels():
    from minipaged.attention.cache_attention import PagedMetadata
    from minipaged.kernels.choose import get_backend

    backend = get_backend("triton", DEVICE)
    assert isinstance(backend, kernels.TritonBackend) and backend.store_kvcache is kernels.store_kvcache
    meta = PagedMetadata.build([[0, 1], [2]], starts=[0, 0], q_lens=[5, 3], block_size=4, device=DEVICE)
    assert backend.plan(meta, 4) == (5, False)  # the prefill grid's longest q_len, planned once per step


@pytest.mark.parametrize(
    "q_lens,launch",
    [([1, 1, 1], "decode"), ([3, 1, 2], "prefill"), ([1, 0, 1], "prefill"), ([2], "prefill")],
    ids=["all decode", "mixed", "a sequence with no new token", "one prompt"],
)
def test_triton_plan_picks_the_decode_launch_only_for_one_token_per_sequence(monkeypatch, q_lens, launch):
    """Decided once per step in ``plan``; every layer's ``attend`` then takes that launch."""
    from minipaged.attention.cache_attention import PagedMetadata
    from minipaged.kernels import backend as triton_backend

    launched = []
    for name in ("decode", "prefill"):
        fn = getattr(triton_backend, f"paged_{name}_attention")
        monkeypatch.setattr(
            triton_backend,
            f"paged_{name}_attention",
            lambda *a, _fn=fn, _name=name, **kw: launched.append(_name) or _fn(*a, **kw),
        )
    g = torch.Generator().manual_seed(0)
    starts = [3] * len(q_lens)
    meta = PagedMetadata.build([[i] for i in range(len(q_lens))], starts, q_lens, block_size=8, device=DEVICE)
    tb = triton_backend.TritonBackend()
    plan = tb.plan(meta, 8)
    assert plan == (max(q_lens), launch == "decode")
    k_cache = torch.randn(len(q_lens), 8, 2, 16, generator=g).to(DEVICE)
    v_cache = torch.randn(len(q_lens), 8, 2, 16, generator=g).to(DEVICE)
    q = torch.randn(sum(q_lens), 4, 16, generator=g).to(DEVICE)
    for _ in range(2):  # two layers, one plan
        out = tb.attend(q, k_cache, v_cache, meta, plan)
        want = reference.paged_prefill_attention(
            q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens
        )
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert launched == [launch, launch]
