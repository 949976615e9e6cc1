"""``bench chat`` (e) and (f): real ShareGPT chats, each stopping at its own end of turn.

(a) gives every chat the same number of new tokens (``ignore_eos``), which makes runs easy to
compare but is not what a server sees: real answers end when the model says so, and the batch
thins out as they do. Here every chat is a real first user turn from ShareGPT (sampled as
vLLM's serving benchmark samples them, rendered with the model's chat template), greedy, EOS
honoured, at most ``max_tokens`` new tokens:

- **(e)** minipaged against transformers' ``generate`` over one left-padded batch of every chat
  (its rows stop at EOS too; the batch runs until the last one does). Output tokens per second
  counts each chat's tokens up to and including its EOS, in both engines;
- **(f)** paged against contiguous on the same KV budget: the contiguous cache reserves
  ``max_model_len`` slots a chat (Orca (Max), the paper's baseline), so the budget fits a few
  chats at a time where paging fits as many as their tokens allow.
- **(g)** what the number format costs in quality: perplexity on held-out ShareGPT answers
  (second turns, which the chats above never show), through the engine's own paged path
  (``prompt_logprobs=0``: each text token's log-probability given the tokens before it), for
  ``dtype="auto"`` and ``"float32"``, and through transformers' forward in fp32 and bf16.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minipaged.engine.llm import LLM
from minipaged.engine.sampling_params import SamplingParams
from minipaged.paper import sharegpt
from minipaged.paper.engine_run import EngineRun

MAX_PROMPT_LEN = 512  # ShareGPT tokens of a first turn: transformers pads every row to the longest


def sharegpt_chats(llm: LLM, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` real first user turns through the chat template, as token ids."""
    tok = llm.tokenizer
    if tok is None or tok.chat_template is None:
        raise ValueError("ShareGPT chats need a model with a tokenizer and a chat template (a GGUF or HF chat model)")
    requests = sharegpt.sample_requests(n, seed, max_prompt_len=MAX_PROMPT_LEN)
    turns = [[{"role": "user", "content": r.prompt}] for r in requests]
    rendered = [tok.chat_template.render(t, add_generation_prompt=True) for t in turns]
    return [tok.encode(text, add_special_tokens=False) for text in rendered]


def run_chats(llm: LLM, prompts: Sequence[list[int]], max_tokens: int) -> EngineRun:
    """Every chat submitted at once, EOS honoured, stepped until the last one ends."""
    run = EngineRun("minipaged")
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    start = time.perf_counter()
    ids = [llm.add_request(p, params) for p in prompts]
    while llm.has_unfinished_requests():
        llm.run_step()
    run.seconds = time.perf_counter() - start
    run.tokens = [llm.get_output(i).outputs[0].token_ids for i in ids]
    run.output_tokens = sum(len(t) for t in run.tokens)
    return run


def _until_eos(row: list[int], eos: Sequence[int]) -> list[int]:
    ends = [i for i, t in enumerate(row) if t in eos]
    return row[: ends[0] + 1] if ends else row


def run_generate(hf: Any, prompts: Sequence[list[int]], max_tokens: int, pad_id: int, eos: list[int]) -> EngineRun:
    """One left-padded ``generate`` batch, greedy, each row up to its EOS (included) or ``max_tokens``
    (``eos`` empty: every row ``max_tokens``, as a model told of no EOS runs)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    run = EngineRun("transformers")
    start = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            **({"eos_token_id": eos} if eos else {}),
        )
    run.seconds = time.perf_counter() - start
    run.tokens = [_until_eos(row, eos) for row in out[:, width:].tolist()]
    run.output_tokens = sum(len(t) for t in run.tokens)
    return run


@dataclass
class ChatsRun:
    """(e) or (f): two engines on the same chats; ``ratio`` is the first's tokens/s over the second's."""

    first: EngineRun
    second: EngineRun

    @property
    def ratio(self) -> float:
        return self.first.tokens_per_s / self.second.tokens_per_s

    @property
    def identical(self) -> int:
        return sum(a == b for a, b in zip(self.first.tokens, self.second.tokens))


def against_transformers(llm: LLM, hf: Any, prompts: Sequence[list[int]], max_tokens: int) -> ChatsRun:
    """(e): minipaged, then transformers, on the same chats."""
    eos = sorted(llm.model.config.eos_token_ids)  # the tokens the engine stops at
    pad_id = llm.model.config.pad_token_id or 0
    return ChatsRun(run_chats(llm, prompts, max_tokens), run_generate(hf, prompts, max_tokens, pad_id, eos))


def paged_against_contiguous(
    model: str, prompts: Sequence[list[int]], max_tokens: int, dtype: str, budget: dict[str, Any]
) -> ChatsRun:
    """(f): the same chats on the same KV budget, paged first, then contiguous (Orca (Max))."""
    paged = run_chats(LLM(model, dtype=dtype, **budget), prompts, max_tokens)
    contiguous = run_chats(LLM(model, dtype=dtype, kv_layout="contiguous", **budget), prompts, max_tokens)
    return ChatsRun(paged, contiguous)


def held_out_texts(llm: LLM, n: int, max_len: int = 256, seed: int = 1) -> list[list[int]]:
    """``n`` ShareGPT answers (second turns) of at least 16 tokens, cut to ``max_len``, as token ids."""
    tok = llm.tokenizer
    if tok is None:
        raise ValueError("held-out text needs the model's tokenizer")
    pairs = sharegpt.ShareGPT.load().pairs()
    texts = [pairs[i][1] for i in sharegpt.sample_indices(sharegpt.default_lengths(), n * 2, seed)]
    ids = [tok.encode(t, add_special_tokens=False)[:max_len] for t in texts]
    return [t for t in ids if len(t) >= 16][:n]


def engine_perplexity(llm: LLM, texts: Sequence[list[int]]) -> float:
    """exp(mean negative log-likelihood) of every token after the first, scored by the engine."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    nll, count = 0.0, 0
    for out in llm.generate(list(texts), params, use_tqdm=False):
        assert out.prompt_logprobs is not None
        for token, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
            assert entry is not None
            nll -= entry[token].logprob
            count += 1
    return math.exp(nll / count)


def transformers_perplexity(hf: Any, texts: Sequence[list[int]]) -> float:
    """The same measure through a transformers model's forward, text by text."""
    nll, count = 0.0, 0
    with torch.inference_mode():
        for ids in texts:
            logits = hf(torch.tensor([ids])).logits[0, :-1].float()
            nll -= torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).sum().item()
            count += len(ids) - 1
    return math.exp(nll / count)
