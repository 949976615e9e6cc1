"""``random:NAME`` models: a real model's shape, seeded random weights, built in-process, no tokenizer."""

from __future__ import annotations

import pytest
import torch

from minipaged import LLM, SamplingParams
from minipaged.model import random_models
from minipaged.model.loader import load_model

NAME = "random:smollm2-135m"


@pytest.fixture(scope="module")
def smollm2():
    model, tokenizer = load_model(NAME)
    return model, tokenizer


def test_smollm2_has_the_shape_and_size_of_smollm2_135m(smollm2):
    model, tokenizer = smollm2
    cfg = model.config
    assert tokenizer is None  # prompts are token ids
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == ("llama", 576, 30, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert cfg.eos_token_ids == ()  # no EOS: every request runs to max_tokens
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, counted once below
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.dtype == torch.float32 and not any(p.requires_grad for p in model.parameters())
    # RoPE's computed buffer holds real frequencies (the model was built on the meta device)
    assert model.model.layers[0].self_attn.rotary.inv_freq[0].item() == 1.0


def test_two_builds_generate_the_same_varied_tokens(smollm2):
    """The same seed gives the same weights and so the same tokens; the tokens depend on the context."""
    prompts = [[1, 2, 3, 4, 5], [100, 200, 300], [7] * 20]
    params = SamplingParams(temperature=0, max_tokens=4)
    first = LLM(NAME, num_kvcache_blocks=8, max_model_len=64).generate(prompts, params, use_tqdm=False)
    random_models._build.cache_clear()  # a second build from scratch
    rebuilt, _ = load_model(NAME)
    assert rebuilt is not smollm2[0]
    assert all(torch.equal(a, b) for a, b in zip(rebuilt.parameters(), smollm2[0].parameters()))
    second = LLM(NAME, num_kvcache_blocks=8, max_model_len=64).generate(prompts, params, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in first]
    assert tokens == [o.outputs[0].token_ids for o in second]
    assert all(len(t) == 4 for t in tokens)
    assert len({t for ids in tokens for t in ids}) > 6  # not one token repeated (what std-0.02 init gives)
    assert all(o.outputs[0].text == "" for o in first)  # no tokenizer: the completion is its ids


def test_an_unknown_random_model_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown random model 'random:nope': known are random:smollm2-135m"):
        LLM("random:nope")
