"""dtype="auto" and friends (minipaged/model/precision.py): what is chosen, why, and what it does."""

from __future__ import annotations

import pytest
import torch

from minipaged import LLM, SamplingParams
from minipaged.model import precision
from minipaged.model.precision import AUTO_BF16_MIN_BYTES, load_dtype, resolve_precision
from minipaged.model.products import PackedProduct, packed_bf16_available
from minipaged.tiny.task import prompt_for

CPU = torch.device("cpu")
BIG = AUTO_BF16_MIN_BYTES


def test_named_dtypes_are_used_as_asked_everywhere():
    for name, dtype in [("float32", torch.float32), ("bfloat16", torch.bfloat16), (torch.float16, torch.float16)]:
        p = resolve_precision(name, CPU, BIG)
        assert (p.weights, p.bf16_products, p.kv_cache) == (dtype, False, dtype)
        assert "was asked for" in p.reason


def test_a_bad_dtype_is_refused_before_anything_is_loaded():
    with pytest.raises(ValueError, match="dtype must be 'auto', one of"):
        load_dtype("float12")
    with pytest.raises(ValueError, match="dtype must be 'auto'"):
        LLM("no/such/folder", dtype="half-ish")  # the dtype is checked first: no folder error


def test_auto_multiplies_in_bf16_only_where_it_pays(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ["avx512_bf16"])
    monkeypatch.setattr(precision, "packed_bf16_available", lambda: True)
    big = resolve_precision("auto", CPU, BIG)
    assert (big.weights, big.bf16_products, big.kv_cache) == (torch.float32, True, torch.bfloat16)
    assert "avx512_bf16" in big.reason and big.name.startswith("auto")
    small = resolve_precision("auto", CPU, BIG - 1)  # fixed costs dominate: stays exact
    assert not small.bf16_products and small.kv_cache == torch.float32 and "fixed costs" in small.reason
    gpu = resolve_precision("auto", torch.device("cuda"), BIG)
    assert not gpu.bf16_products and gpu.weights == torch.float32
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: [])
    plain = resolve_precision("auto", CPU, BIG)
    assert not plain.bf16_products and "no bf16 arithmetic" in plain.reason


def test_the_cpu_flags_are_read_from_the_machine():
    flags = precision.cpu_bf16_flags()
    assert set(flags) <= {"amx_bf16", "avx512_bf16"}
    with open("/proc/cpuinfo") as f:
        text = f.read()
    assert ("avx512_bf16" in flags) == (" avx512_bf16" in text)


@pytest.mark.skipif(not (packed_bf16_available() and precision.cpu_bf16_flags()), reason="no bf16 arithmetic here")
def test_auto_on_the_embedded_model_made_large_enough_keeps_its_answers(monkeypatch):
    """The copy model in packed bf16 with a bf16 cache (twice the blocks in the same memory)
    writes the same copies as in fp32: its margins are wide. Batched equals alone, too."""
    monkeypatch.setattr(precision, "AUTO_BF16_MIN_BYTES", 0)
    budget = dict(kv_cache_memory=2**20, max_model_len=128)
    exact, auto = LLM(dtype="float32", **budget), LLM(dtype="auto", **budget)
    assert auto.precision.bf16_products and auto.kv_cache.k.dtype == torch.bfloat16
    assert isinstance(auto.model.model.layers[0].self_attn.qkv, PackedProduct)
    assert auto.num_blocks == 2 * exact.num_blocks
    texts = ["hello paged world", "a cache of blocks", "z"]
    prompts = [prompt_for(t, preamble="blocks of sixteen tokens ") for t in texts]
    sp = SamplingParams(temperature=0, max_tokens=24)
    want = [o.outputs[0].text for o in exact.generate(prompts, sp, use_tqdm=False)]
    assert want == texts  # the model copies
    assert [o.outputs[0].text for o in auto.generate(prompts, sp, use_tqdm=False)] == want
    assert [auto.generate([p], sp, use_tqdm=False)[0].outputs[0].text for p in prompts] == want
