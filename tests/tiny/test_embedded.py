"""The embedded tiny model: its task, its tokenizer, and its accuracy through the engine."""

from __future__ import annotations

import random

import pytest
import torch

from minipaged import LLM
from minipaged.attention.cache_attention import RecomputeAttention
from minipaged.model import EMBEDDED_MODEL_DIR, load_model
from minipaged.tiny import task


@pytest.mark.slow
def test_prompt_format_and_tokenizer_round_trip():
    prompt = task.prompt_for("hi there", preamble="some words ")
    assert prompt == "some words <copy>hi there<end>"
    _, tok = load_model()
    ids = tok.encode(prompt)
    assert ids[-10:] == [256, *b"hi there", 257] and tok.decode(ids) == "some words hi there"
    assert tok.decode(ids, skip_special_tokens=False) == prompt
    assert task.expected_completion("hi there") == "hi there"


def test_held_out_cases_are_seeded_and_in_range():
    cases = task.held_out_cases(200)
    assert cases == task.held_out_cases(200)
    assert all(1 <= len(t) <= 48 and 0 <= len(p) <= 512 and "<" not in p for t, p in cases)
    assert max(len(p) for _, p in cases) > 450


def test_model_is_small_gqa_and_shipped_in_16_bit():
    model, _ = load_model()
    cfg = model.config
    assert cfg.num_hidden_layers >= 2 and cfg.num_key_value_heads < cfg.num_attention_heads
    size = sum(f.stat().st_size for f in EMBEDDED_MODEL_DIR.glob("*.safetensors"))
    assert size < 5e6


@pytest.mark.slow
def test_embedded_checkpoint_matches_transformers():
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR, dtype=torch.float32).eval()
    model, tok = load_model()
    ids = torch.tensor(tok.encode(task.prompt_for("paged kv", "a preamble ")))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    ours = model(ids, torch.arange(len(ids)), RecomputeAttention(torch.tensor([0, len(ids)])))
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_accuracy_through_the_batched_engine_with_preemptions():
    """>= 99% exact greedy copies on 200 held-out cases, served by a pool far too small for the batch."""
    llm = LLM(num_kvcache_blocks=160, max_num_seqs=32, enable_prefix_caching=True)
    accuracy, n = task.evaluate(200, llm=llm)
    assert n == 200 and accuracy >= 0.99, accuracy
    stats = llm.kv_stats()
    assert stats["num_preemptions"] > 0 and stats["num_free_blocks"] == 160


@pytest.mark.slow
def test_words_and_other_alphabets_with_and_without_a_preamble():
    """Copying is not tied to the training texts: words, upper case, punctuation, and prompts that
    start right at <copy> (no preamble) or after a long one."""
    from minipaged import SamplingParams

    rng = random.Random(7)
    texts = ["block tables", "the quick brown fox", "Hello, World!", "ABC-123 xyz?", "copy on write", "kv cache"]
    texts += [task.random_text(rng, 5, 30) for _ in range(4)]
    preambles = ["", "system: ", task.random_preamble(rng, 400, 500)]
    prompts = [task.prompt_for(t, p) for p in preambles for t in texts]
    outs = LLM().generate(prompts, SamplingParams(temperature=0, max_tokens=50), use_tqdm=False)
    wrong = [(o.prompt[-60:], o.outputs[0].text) for o, t in zip(outs, texts * 3) if o.outputs[0].text != t]
    assert len(wrong) <= 1, wrong
