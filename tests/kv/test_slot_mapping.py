"""Stage 3: slots, the paged KV write, the torch paged attention, and the model on a paged cache."""

from __future__ import annotations

import pytest
import torch

from minipaged.attention import reference
from minipaged.attention.reference import store_kvcache
from minipaged.engine.static_generate import greedy_generate
from minipaged.kv.block_table import padded_block_tables
from minipaged.kv.paged_cache import PagedKVCache
from minipaged.kv.slot_mapping import build_slot_mapping, slots_for
from minipaged.model import load_model
from minipaged.tiny.task import prompt_for


def test_slot_is_block_times_block_size_plus_offset():
    assert slots_for([7, 3], 0, 24, 16) == list(range(112, 128)) + list(range(48, 56))
    assert slots_for([7, 3], 23, 24, 16) == [55]  # a decode step writes one slot
    mapping = build_slot_mapping([[7, 3], [7, 9]], starts=[23, 16], ends=[24, 20], block_size=16)
    assert mapping.dtype == torch.int64 and mapping.tolist() == [55, 144, 145, 146, 147]
    with pytest.raises(ValueError, match="need 3 blocks, the table has 2"):
        slots_for([7, 3], 0, 33, 16)


def test_store_kvcache_scatters_by_slot_and_skips_padding():
    k_cache = torch.zeros(4, 2, 1, 3)
    v_cache = torch.zeros(4, 2, 1, 3)
    key = torch.arange(9.0).view(3, 1, 3)
    store_kvcache(key, -key, k_cache, v_cache, torch.tensor([5, -1, 0]))
    assert torch.equal(k_cache[2, 1, 0], key[0, 0]) and torch.equal(k_cache[0, 0, 0], key[2, 0])
    assert torch.equal(v_cache[2, 1, 0], -key[0, 0])
    assert int((k_cache != 0).any(-1).sum()) == 2  # the -1 token wrote nothing


def test_paged_attention_equals_attention_over_the_gathered_context():
    g = torch.Generator().manual_seed(0)
    block_size, kv_heads, heads, dim = 4, 2, 6, 8
    cache = PagedKVCache(1, 12, block_size, kv_heads, dim)
    tables = [[9, 2, 5], [0, 11]]
    context = [10, 7]
    for table, n in zip(tables, context):
        slots = build_slot_mapping([table], [0], [n], block_size)
        store_kvcache(
            torch.randn(n, kv_heads, dim, generator=g),
            torch.randn(n, kv_heads, dim, generator=g),
            cache.k[0],
            cache.v[0],
            slots,
        )
    q_lens = [3, 1]
    q = torch.randn(sum(q_lens), heads, dim, generator=g)
    cu = torch.tensor([0, 3, 4], dtype=torch.int32)
    out = reference.paged_prefill_attention(
        q, cache.k[0], cache.v[0], padded_block_tables(tables), cu, torch.tensor(context, dtype=torch.int32)
    )
    for i, (table, n) in enumerate(zip(tables, context)):
        k = reference.gather_kv(cache.k[0], torch.tensor(table), n)
        v = reference.gather_kv(cache.v[0], torch.tensor(table), n)
        want = reference.causal_attention(q[cu[i] : cu[i + 1]], k, v)
        torch.testing.assert_close(out[cu[i] : cu[i + 1]], want, rtol=0, atol=0)
    decode = reference.paged_decode_attention(
        q[[2, 3]], cache.k[0], cache.v[0], padded_block_tables(tables), torch.tensor(context, dtype=torch.int32)
    )
    torch.testing.assert_close(decode, out[[2, 3]], rtol=0, atol=0)


@pytest.mark.slow
def test_embedded_model_on_shuffled_paged_cache_equals_contiguous():
    model, tok = load_model()
    cases = [("paged attention", ""), ("kv", "system: copy the text. "), ("blocks of 8", "hi " * 20)]
    prompts = [tok.encode(prompt_for(t, p)) for t, p in cases]
    paged = greedy_generate(model, prompts, 16, cache="paged", block_size=8, shuffle_seed=5)
    contiguous = greedy_generate(model, prompts, 16, cache="contiguous")
    assert paged.tokens == contiguous.tokens
    for a, b in zip(paged.logits, contiguous.logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    tables = [t.block_ids for t in paged.cache.tables]
    assert any(t != sorted(t) for t in tables)  # blocks really are scattered
    eos = tok.eos_token_id
    assert [tok.decode(t[: t.index(eos)]) for t in paged.tokens] == [t for t, _ in cases]
