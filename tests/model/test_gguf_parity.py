"""SmolLM2-135M-Instruct read from its GGUF by minipaged and by transformers: same logits, same chats."""

from __future__ import annotations

import pytest
import torch

from minipaged import LLM, SamplingParams
from minipaged.attention.cache_attention import RecomputeAttention

NUM_CHATS, NEW_TOKENS = 32, 64
MAX_PROMPT_CHARS = 400  # first human turns, cut: a couple of minutes for 32 chats on 2 cores

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm(real_model):
    return LLM(real_model, dtype="float32", max_model_len=1024, max_num_seqs=NUM_CHATS)


@pytest.fixture(scope="module")
def chat_prompts(llm, sharegpt_turns) -> list[list[int]]:
    """The first NUM_CHATS human turns, rendered with the model's chat template, as token ids."""
    tok = llm.tokenizer
    questions = [t[:MAX_PROMPT_CHARS] for t in sharegpt_turns if t.strip()][::7][:NUM_CHATS]
    texts = [tok.chat_template.render([{"role": "user", "content": q}]) for q in questions]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def test_config_from_metadata(llm):
    c = llm.model.config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert (c.rope_theta, c.max_position_embeddings, c.tie_word_embeddings) == (100000.0, 8192, True)
    assert c.rms_norm_eps == pytest.approx(1e-5) and c.eos_token_ids == (2,)
    assert llm.model.lm_head.weight is llm.model.model.embed_tokens.weight


def test_logits_match_transformers(llm, hf_gguf_model, chat_prompts):
    worst = 0.0
    for ids in chat_prompts[:6]:
        ours = llm.model(torch.tensor(ids), torch.arange(len(ids)), RecomputeAttention(torch.tensor([0, len(ids)])))
        with torch.no_grad():
            theirs = hf_gguf_model(torch.tensor([ids])).logits[0]
        worst = max(worst, (ours - theirs).abs().max().item())
    print(f"max |logit difference| over 6 chat prompts: {worst:.2e}")
    assert worst <= 1e-4


def test_greedy_chats_match_transformers(llm, hf_gguf_model, chat_prompts):
    """32 chats, 64 new tokens each (or up to <|im_end|>): minipaged's engine against one left-padded
    transformers ``generate`` batch (its positions follow the attention mask)."""
    outs = llm.generate(chat_prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS), use_tqdm=False)
    width = max(map(len, chat_prompts))
    ids = torch.tensor([[2] * (width - len(p)) + p for p in chat_prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chat_prompts])
    with torch.no_grad():
        hf = hf_gguf_model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=2, pad_token_id=2
        )[:, width:].tolist()
    same = 0
    for out, theirs in zip(outs, hf):
        theirs = theirs[: theirs.index(2) + 1] if 2 in theirs else theirs  # padding after <|im_end|> dropped
        same += out.outputs[0].token_ids == theirs
    print(f"greedy chats identical to transformers: {same}/{len(chat_prompts)}")
    assert same == len(chat_prompts)


def test_answers_the_capital_of_france(llm):
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    prompt = llm.tokenizer.encode(llm.tokenizer.chat_template.render(msgs), add_special_tokens=False)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    assert out[0].outputs[0].text == "The capital of France is Paris."


def _perplexity(model: torch.nn.Module, texts: list[list[int]]) -> float:
    """exp(mean next-token negative log-likelihood) over ``texts``, each run whole without a cache."""
    nll, count = 0.0, 0
    with torch.inference_mode():
        for ids in texts:
            logits = model(torch.tensor(ids), torch.arange(len(ids)), RecomputeAttention(torch.tensor([0, len(ids)])))
            logp = torch.log_softmax(logits[:-1].float(), dim=-1)
            nll -= logp.gather(1, torch.tensor(ids[1:])[:, None]).sum().item()
            count += len(ids) - 1
    return float(torch.exp(torch.tensor(nll / count)))


def test_auto_dtype_keeps_the_answers_of_float32(llm, real_model, chat_prompts, sharegpt_turns):
    """dtype="auto" (bf16 products and KV cache where the CPU multiplies bf16): the first greedy
    token of 32 real chats equals fp32's on at least 95% of them, the capital of France stays
    Paris, and perplexity on held-out ShareGPT text is within 1% of fp32's."""
    auto = LLM(real_model, max_model_len=1024, max_num_seqs=NUM_CHATS)  # the default dtype
    first = SamplingParams(temperature=0, max_tokens=1)
    want = [o.outputs[0].token_ids for o in llm.generate(chat_prompts, first, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in auto.generate(chat_prompts, first, use_tqdm=False)]
    same = sum(a == b for a, b in zip(got, want))
    print(f"{auto.precision.name}: first greedy token equal to float32 on {same}/{len(want)} chats")
    assert same >= 0.95 * len(want)
    test_answers_the_capital_of_france(auto)
    texts = [llm.tokenizer.encode(t[:600], add_special_tokens=False) for t in sharegpt_turns[1::13][:24]]
    exact, ours = _perplexity(llm.model, texts), _perplexity(auto.model, texts)
    print(f"ShareGPT perplexity: float32 {exact:.3f}, {auto.precision.name} {ours:.3f}")
    assert abs(ours / exact - 1) < 0.01
