"""The attention paths against the oracle: the batched torch path (and the caches' attention
objects) must give what :mod:`minipaged.attention.reference` gives, on any batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.attention import batched, reference
from minipaged.attention.backends import resolve_backend
from minipaged.attention.batched import TorchBackend
from minipaged.attention.cache_attention import PagedAttention, PagedMetadata
from minipaged.attention.reference import ReferenceBackend, varlen_attention
from minipaged.kernels.choose import get_backend
from minipaged.kv.contiguous import ContiguousKVCache, ContiguousStats, ReservationExceededError
from minipaged.utils import cdiv

HEAD_LAYOUTS = [(1, 1), (4, 4), (8, 2), (6, 3), (8, 1)]


@st.composite
def paged_batches(draw):
    """A random batch: any mix of decode rows, prefill chunks, prefix hits and empty rows."""
    block_size = draw(st.sampled_from([1, 2, 4, 16, 32]))
    heads, kv_heads = draw(st.sampled_from(HEAD_LAYOUTS))
    head_dim = draw(st.sampled_from([4, 8, 16]))
    num_seqs = draw(st.integers(1, 6))
    q_lens, context_lens = [], []
    for _ in range(num_seqs):
        kind = draw(st.sampled_from(["decode", "prefill", "chunk", "empty"]))
        q = {"decode": 1, "empty": 0}.get(kind) or draw(st.integers(2, 40))
        cached = 0 if kind == "prefill" else draw(st.integers(0 if kind != "decode" else 0, 70))
        q_lens.append(q)
        context_lens.append(max(q + cached, 1 if kind != "empty" else 0))
    seed = draw(st.integers(0, 2**16))
    return block_size, heads, kv_heads, head_dim, q_lens, context_lens, seed


def make_batch(block_size, heads, kv_heads, head_dim, q_lens, context_lens, seed):
    g = torch.Generator().manual_seed(seed)
    blocks = [cdiv(c, block_size) for c in context_lens]
    num_blocks = sum(blocks) + 3
    order = torch.randperm(num_blocks, generator=g).tolist()  # scattered physical blocks
    tables, used = [], 0
    for n in blocks:
        tables.append(order[used : used + n])
        used += n
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    starts = [c - q for c, q in zip(context_lens, q_lens)]
    meta = PagedMetadata.build(tables, starts, q_lens, block_size)
    q = torch.randn(sum(q_lens), heads, head_dim, generator=g)
    return q, k_cache, v_cache, meta


@settings(max_examples=150, deadline=None)
@given(paged_batches())
@pytest.mark.slow
def test_batched_prefill_equals_the_reference(batch):
    q, k_cache, v_cache, meta = make_batch(*batch)
    args = (q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens)
    want = reference.paged_prefill_attention(*args)
    got = batched.paged_prefill_attention(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(paged_batches())
@pytest.mark.slow
def test_batched_decode_equals_the_reference(batch):
    block_size, heads, kv_heads, head_dim, q_lens, context_lens, seed = batch
    q_lens = [1] * len(q_lens)
    context_lens = [max(c, 1) for c in context_lens]
    q, k_cache, v_cache, meta = make_batch(block_size, heads, kv_heads, head_dim, q_lens, context_lens, seed)
    args = (q, k_cache, v_cache, meta.block_tables, meta.context_lens)
    torch.testing.assert_close(
        batched.paged_decode_attention(*args), reference.paged_decode_attention(*args), rtol=1e-5, atol=1e-5
    )


def test_bf16_cache_is_computed_in_fp32_like_the_reference():
    q, k_cache, v_cache, meta = make_batch(4, 8, 2, 16, [1, 7, 0, 30], [9, 7, 3, 41], seed=1)
    args = (
        q.bfloat16(),
        k_cache.bfloat16(),
        v_cache.bfloat16(),
        meta.block_tables,
        meta.cu_seqlens_q,
        meta.context_lens,
    )
    got = batched.paged_prefill_attention(*args)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, reference.paged_prefill_attention(*args), rtol=1e-2, atol=1e-2)


def test_plan_splits_decode_rows_from_prefill_rows():
    tables = torch.arange(5 * 6, dtype=torch.int32).view(5, 6)
    plan = batched.plan_batch([1, 5, 0, 1, 3], [10, 5, 4, 2, 20], tables, block_size=4)
    (decode,) = plan.decode
    assert decode.seqs.tolist() == [0, 3] and decode.rows.tolist() == [0, 6]
    (prefill,) = plan.prefill
    assert prefill.seqs.tolist() == [1, 4] and prefill.rows.tolist() == [1, 2, 3, 4, 5, 7, 8, 9]
    assert prefill.max_q_len == 5 and prefill.num_blocks == 5  # ceil(20 / 4)
    # query 0 of the 3 new tokens of a 20-token context sits at position 17: it sees keys 0..17
    assert (prefill.bias[1, 0, 0] == 0).nonzero().flatten().tolist() == list(range(18))
    assert prefill.bias[1, 0, 0, 18:].eq(float("-inf")).all()
    assert prefill.blocks.tolist() == list(range(6, 11)) + list(range(24, 29))  # 5 blocks of seqs 1 and 4
    assert not decode.all_rows and batched.plan_batch([1, 1], [3, 4], tables[:2], 4).decode[0].all_rows
    assert batched.plan_batch([0, 0], [3, 4], tables[:2], 4).decode == []


def test_decode_rows_split_by_context_length_when_it_saves_padding():
    lens, ones = [4, 300, 8, 5, 290, 6, 7, 310, 280, 9], [1] * 10
    assert batched.split_by_length(list(range(10)), ones, lens, 16) == [[0, 2, 3, 5, 6, 9], [1, 4, 7, 8]]
    assert batched.split_by_length(list(range(10)), ones, [300] * 10, 16) == [list(range(10))]
    assert batched.split_by_length([0, 1, 2], ones, lens, 16) == [[0, 1, 2]]
    # prefill rows: padded to the longest q_len as well
    assert batched.split_by_length([0, 1, 2, 3], [200, 10, 190, 12], [200, 10, 190, 12], 16, 2) == [[1, 3], [0, 2]]


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_paged_attention_writes_then_reads_through_the_tables(backend):
    torch.manual_seed(0)
    q, k_cache, v_cache, meta = make_batch(4, 8, 2, 16, [3, 1, 6], [3, 9, 10], seed=2)
    k_new, v_new = torch.randn(10, 2, 16), torch.randn(10, 2, 16)
    attn = PagedAttention(k_cache[None].clone(), v_cache[None].clone(), get_backend(backend))
    attn.set_batch(meta)
    got = attn.attend(0, q, k_new, v_new)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    reference.store_kvcache(k_new, v_new, ref_k, ref_v, meta.slot_mapping)
    want = reference.paged_prefill_attention(q, ref_k, ref_v, meta.block_tables, meta.cu_seqlens_q, meta.context_lens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pad", [False, True])
def test_batched_store_equals_the_reference(pad):
    g = torch.Generator().manual_seed(3)
    key, value = torch.randn(6, 2, 8, generator=g), torch.randn(6, 2, 8, generator=g)
    slots = torch.tensor([5, 17, 2, -1 if pad else 30, 9, 0])
    caches = [torch.zeros(4, 8, 2, 8) for _ in range(4)]
    reference.store_kvcache(key, value, caches[0], caches[1], slots)
    batched.store_kvcache(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[2].count_nonzero() == (5 if pad else 6) * 2 * 8


def test_backend_names():
    assert resolve_backend("auto", "cpu") == "torch" and resolve_backend("auto", "cuda") == "triton"
    assert isinstance(get_backend("reference"), ReferenceBackend) and isinstance(get_backend("torch"), TorchBackend)
    assert get_backend("auto", "cpu").name == "torch"
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        resolve_backend("flash")


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_contiguous_reservations_read_as_one_slot_blocks_match_varlen_attention(backend):
    torch.manual_seed(0)
    num_layers, heads, kv_heads, head_dim, decode_steps = 2, 4, 2, 8, 3
    prompts = [5, 1, 9]
    seqs = ["a", "b", "c"]
    cache = ContiguousKVCache(num_layers, kv_heads, head_dim, max_seq_len=16, num_slots=64)
    cache.add_sequence("spacer", reserve=5)  # so no sequence starts at slot 0
    for s in seqs:
        cache.add_sequence(s)
    cache.remove_sequence("spacer")
    attn = PagedAttention(cache.k.unsqueeze(2), cache.v.unsqueeze(2), get_backend(backend))
    total = [p + decode_steps for p in prompts]
    # Each sequence's q/k/v for every position and layer, as a model would produce them.
    q = [torch.randn(num_layers, n, heads, head_dim) for n in total]
    k = [torch.randn(num_layers, n, kv_heads, head_dim) for n in total]
    v = [torch.randn(num_layers, n, kv_heads, head_dim) for n in total]

    def pack(per_seq: list[torch.Tensor], layer: int, ranges: list[tuple[int, int]]) -> torch.Tensor:
        return torch.cat([t[layer, lo:hi] for t, (lo, hi) in zip(per_seq, ranges, strict=True)])

    def step(lo: list[int], hi: list[int]) -> None:
        """New tokens lo[i] .. hi[i] - 1 of each sequence; compare with no-cache attention over 0 .. hi[i] - 1."""
        tables = [cache.arena.table(s, h) for s, h in zip(seqs, hi, strict=True)]
        assert tables[0].start == 5  # the freed spacer leaves slots 0-4 empty: no table starts at slot 0
        attn.set_batch(PagedMetadata.build(tables, lo, [h - lo_ for lo_, h in zip(lo, hi, strict=True)], 1))
        cache.num_tokens.update(zip(seqs, hi, strict=True))  # the cache's owner keeps its record
        new, whole = list(zip(lo, hi, strict=True)), [(0, h) for h in hi]
        cu = torch.tensor([0, *hi]).cumsum(0)
        for layer in range(num_layers):
            got = attn.attend(layer, pack(q, layer, new), pack(k, layer, new), pack(v, layer, new))
            full = varlen_attention(pack(q, layer, whole), pack(k, layer, whole), pack(v, layer, whole), cu)
            want = torch.cat([full[cu[i] + lo_ : cu[i + 1]] for i, lo_ in enumerate(lo)])
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    step([0, 0, 0], prompts)  # prefill
    assert cache.stats() == ContiguousStats(reserved_slots=48, used_slots=15)
    for j in range(decode_steps):
        step([p + j for p in prompts], [p + j + 1 for p in prompts])
    assert cache.stats().used_slots == sum(total)
    assert cache.stats().waste_pct == pytest.approx(50.0)


def test_a_contiguous_table_refuses_an_overflowing_reservation_before_any_write():
    cache = ContiguousKVCache(1, num_kv_heads=1, head_dim=4, max_seq_len=16, num_slots=32)
    cache.add_sequence("small", reserve=4)
    cache.add_sequence("neighbour")
    assert cache.arena.table("small", 4) == range(0, 4) and cache.arena.table("neighbour", 3) == range(4, 7)
    with pytest.raises(ReservationExceededError, match="sequence 'small' needs 5 slots but reserved only 4"):
        cache.arena.table("small", 5)
    with pytest.raises(ReservationExceededError, match="needs 6 slots but reserved only 4"):
        cache.write(0, "small", 2, torch.ones(4, 1, 4), torch.ones(4, 1, 4))
    assert cache.k.abs().sum() == 0 and cache.stats().used_slots == 0  # the neighbour's buffer is intact


def test_split_decode_groups_equal_the_reference():
    lens = [4, 300, 8, 5, 290, 6, 7, 310, 280, 9]
    q, k_cache, v_cache, meta = make_batch(16, 8, 2, 16, [1] * 10, lens, seed=4)
    plan = batched.plan_batch(meta.host_q_lens, meta.host_context_lens, meta.block_tables, 16)
    assert len(plan.decode) == 2
    args = (q, k_cache, v_cache, meta.block_tables, meta.context_lens)
    got = batched.paged_decode_attention(*args, plan=plan)
    torch.testing.assert_close(got, reference.paged_decode_attention(*args), rtol=1e-5, atol=1e-5)


def test_split_prefill_groups_equal_the_reference():
    q_lens, ctx = [200, 10, 190, 12, 1, 1], [230, 10, 190, 40, 300, 3]
    q, k_cache, v_cache, meta = make_batch(16, 8, 2, 16, q_lens, ctx, seed=5)
    plan = batched.plan_batch(meta.host_q_lens, meta.host_context_lens, meta.block_tables, 16)
    assert len(plan.prefill) == 2 and len(plan.decode) == 1
    args = (q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens)
    got = batched.paged_prefill_attention(*args, plan=plan)
    torch.testing.assert_close(got, reference.paged_prefill_attention(*args), rtol=1e-5, atol=1e-5)
