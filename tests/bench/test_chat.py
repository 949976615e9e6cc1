"""``bench chat`` through its function, on the random model of SmolLM2-135M's shape: what it prints
and the arithmetic of its ratios. No timing is asserted."""

from __future__ import annotations

import re

import pytest

from minipaged.bench import chat


@pytest.mark.slow  # builds random:smollm2-135m (134.5M parameters) and a transformers twin
def test_quick_bench_chat_prints_its_three_parts_and_their_ratios(capsys):
    figures = chat.main(["--model", "random:smollm2-135m", "--quick", "--dtype", "float32"])
    out = capsys.readouterr().out
    # every weight but the 61 RMSNorm vectors (35,136 numbers), the tied LM head counted once, in fp32
    assert figures["weight_bytes"] == (134_515_008 - 35_136) * 4
    assert out.startswith("random:smollm2-135m: float32, 538 MB of weights read a step")
    # (a): one line per number of chats, ratio = our tokens/s over theirs
    rows = figures["rows"]
    assert [r.chats for r in rows] == [1, 2]
    for r in rows:
        line = re.search(rf"^\s+{r.chats} chats .*$", out, re.M)
        assert line is not None
        assert f"ratio {r.ours.tokens_per_s / r.theirs.tokens_per_s:.2f}x" in line.group()
        assert f"identical tokens {r.identical}/{r.chats} chats" in line.group()
        assert r.ours.output_tokens == r.theirs.output_tokens == 4 * r.chats
        assert [len(t) for t in r.ours.tokens] == [len(t) for t in r.theirs.tokens] == [4] * r.chats
    assert rows[0].ours.tokens == rows[0].theirs.tokens  # one chat, no padding: greedy agrees
    # (b): the step over the time to read the weights once at the measured bandwidth
    floor = figures["weight_bytes"] / figures["bandwidth"]
    assert f"step / bandwidth limit {figures['step'] / floor:.2f}x" in out
    assert f"({figures['bandwidth'] / 1e9:.1f} GB/s)" in out
    # (c): at 1 and 2 rows, the parts add up to the step
    assert set(figures["breakdown"]) == {1, 2}
    for n, parts in figures["breakdown"].items():
        assert list(parts) == ["step", "outside the forward", "attention", "rest of the forward"]
        assert all(v > 0 for v in parts.values())
        assert parts["outside the forward"] + parts["attention"] + parts["rest of the forward"] == pytest.approx(
            parts["step"]
        )
        assert re.search(rf"^\s+{n} rows  step .*outside the forward .*attention .*rest of the forward", out, re.M)
    # (d): the step at 1 and 2 rows in fp32 and auto, each over its own 1-row step
    curve = figures["curve"]
    assert list(curve) == ["float32", "auto"] and all(len(c) == 2 and min(c) > 0 for c in curve.values())
    line = re.search(r"^\s+2 rows  float32 .*$", out, re.M)
    assert line is not None
    for d, c in curve.items():
        assert f"{d} {1e3 * c[1]:6.1f} ({c[1] / c[0]:.2f}x)" in line.group()


def test_chat_prompts_are_random_ids_without_a_tokenizer_and_templated_with_one():
    from minipaged import LLM

    llm = LLM(None, num_kvcache_blocks=16)  # the embedded model: a byte tokenizer, no chat template
    assert llm.tokenizer is not None and llm.tokenizer.chat_template is None
    prompts = chat.chat_prompts(llm, 3)
    assert prompts == [llm.tokenizer.encode(q) for q in chat.QUESTIONS[:3]]
    llm.tokenizer = None
    ids = chat.chat_prompts(llm, 4)
    assert len(ids) == 4 and all(20 <= len(p) <= 40 for p in ids) and ids == chat.chat_prompts(llm, 4)
