"""``bench chat`` through its function, on the random model of SmolLM2-135M's shape: what it prints
and the arithmetic of its ratios. No timing is asserted."""

from __future__ import annotations

import re

import pytest

from minipaged.bench import chat
from minipaged.paper.plots import draw_step_curve
from minipaged.viz.style import figure_text


@pytest.mark.slow  # builds random:smollm2-135m (134.5M parameters) and a transformers twin
def test_quick_bench_chat_prints_its_three_parts_and_their_ratios(capsys, tmp_path):
    plot = tmp_path / "curve.png"
    figures = chat.main(["--model", "random:smollm2-135m", "--quick", "--dtype", "float32", "--plot", str(plot)])
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
    assert f"(d) drawn with the bandwidth lines: {plot}" in out and plot.stat().st_size > 10_000
    assert plot.read_bytes().startswith(b"\x89PNG")
    # the figure: a line per number format, and its weights' read at the bandwidth as a floor
    fig = draw_step_curve([1, 2], curve, {"float32": 0.01, "auto": 0.005})
    text = figure_text(fig)
    assert "decode step, float32" in text and "reading the auto weights once" in text
    ax = fig.axes[0]
    assert [list(line.get_ydata()) for line in ax.lines[::2]] == [[1e3 * t for t in c] for c in curve.values()]
    assert [line.get_ydata()[0] for line in ax.lines[1::2]] == [10.0, 5.0]
    # (e), (f): real chats need a chat template, which a random model has not
    assert "(e), (f): skipped, the model has no chat template" in out
    assert "sharegpt" not in figures


@pytest.mark.slow  # the real model: (e) against transformers and (f) paged against contiguous
def test_real_sharegpt_chats_stop_at_eos_in_both_engines_and_on_both_layouts(real_model):
    from minipaged import LLM
    from minipaged.bench import sharegpt_chats as sc

    budget = dict(num_kvcache_blocks=128, block_size=16, max_model_len=1024, max_num_seqs=8)  # 2 reservations
    llm = LLM(real_model, dtype="float32", **budget)
    prompts = sc.sharegpt_chats(llm, 3)
    assert prompts == sc.sharegpt_chats(llm, 3) and all(len(p) <= sc.MAX_PROMPT_LEN + 40 for p in prompts)
    assert all(
        p[-3:] == llm.tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)[-3:] for p in prompts
    )
    e = sc.against_transformers(llm, chat.transformers_twin(llm.model), prompts, max_tokens=12)
    eos = set(llm.model.config.eos_token_ids)
    for tokens in e.first.tokens + e.second.tokens:  # up to 12 tokens, an EOS only at the end
        assert 1 <= len(tokens) <= 12 and not eos & set(tokens[:-1])
    assert e.first.output_tokens == sum(len(t) for t in e.first.tokens)
    assert e.identical == 3  # fp32 greedy: the same words, EOS where transformers stops
    assert e.ratio == pytest.approx(e.first.tokens_per_s / e.second.tokens_per_s)
    f = sc.paged_against_contiguous(real_model, prompts, 12, "float32", budget)
    assert f.identical == 3 and f.first.tokens == e.first.tokens  # same answers on either layout
    # (g): the engine's paged path scores text as transformers' forward does, in fp32
    texts = sc.held_out_texts(llm, 2, max_len=48)
    assert len(texts) == 2 and all(16 <= len(t) <= 48 for t in texts)
    ours, theirs = (
        sc.engine_perplexity(llm, texts),
        sc.transformers_perplexity(chat.transformers_twin(llm.model), texts),
    )
    assert 1 < ours < 1000 and ours == pytest.approx(theirs, rel=1e-4)


def test_chat_prompts_are_random_ids_without_a_tokenizer_and_templated_with_one():
    from minipaged import LLM

    llm = LLM(None, num_kvcache_blocks=16)  # the embedded model: a byte tokenizer, no chat template
    assert llm.tokenizer is not None and llm.tokenizer.chat_template is None
    prompts = chat.chat_prompts(llm, 3)
    assert prompts == [llm.tokenizer.encode(q) for q in chat.QUESTIONS[:3]]
    llm.tokenizer = None
    ids = chat.chat_prompts(llm, 4)
    assert len(ids) == 4 and all(20 <= len(p) <= 40 for p in ids) and ids == chat.chat_prompts(llm, 4)
