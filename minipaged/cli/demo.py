"""``python -m minipaged demo``: real chats through the paged engine, then the copy model's check.

Part one serves a batch of chats with a real chat model (SmolLM2-135M-Instruct unless
``--model`` names another): every chat starts with the same system prompt, so its rendered
prompt starts with the same tokens. With prefix caching on, those tokens' full blocks are
computed once and held by every chat at once (``ref_cnt`` = the number of chats); each chat
computes only its own question. Then the KV memory these chats hold, paged (blocks of 16) against
what a contiguous cache would reserve (``max_model_len`` slots a chat).

Part two is the embedded copy model's exact check (2 layers, 2M parameters, in the package):
it copies the text between ``<copy>`` and ``<end>``, so every completion has one right answer.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence

from minipaged.engine.llm import LLM
from minipaged.engine.messages import as_conversations, render, template_of
from minipaged.engine.outputs import RequestOutput
from minipaged.engine.sampling_params import SamplingParams
from minipaged.model.chat_template import ChatTemplate
from minipaged.tiny import task
from minipaged.utils import cdiv
from minipaged.viz.snapshot import step_snapshot

SYSTEM_PROMPT = (
    "You are a patient teacher in a short course on how language models are served on computers. "
    "Answer each question in one or two plain sentences, without lists, for a student who is new to the topic."
)
QUESTIONS = (
    "What is the capital of France? Answer in one sentence.",
    "What is a page table in an operating system?",
    "What does a language model's KV cache store?",
    "Why does a GPU need a lot of memory bandwidth?",
    "What is a token in a language model?",
    "Why do operating systems use virtual memory?",
    "What does batching requests together do for a server?",
    "What is the difference between a process and a thread?",
)


def main(args: argparse.Namespace) -> None:
    print(f"Part 1: {args.num_chats} chats with {args.model}, one shared system prompt, through the paged engine\n")
    try:
        llm = LLM(args.model, enable_prefix_caching=True)
        template = template_of(llm.tokenizer)
    except Exception as e:  # no network, no such folder, no chat template: the copy model's part still runs
        print(f"No chats: {type(e).__name__}: {e}\n(pass --model FOLDER for a local chat model)")
        chatted = False
    else:
        real_chats(llm, template, QUESTIONS[: args.num_chats], args.max_tokens)
        chatted = True
    print("\nPart 2: the embedded copy model, whose every completion has one right answer\n")
    copy_check(args.num_prompts, args.num_blocks, args.seed)
    if not chatted:
        raise SystemExit(1)


def real_chats(llm: LLM, template: ChatTemplate, questions: Sequence[str], max_tokens: int) -> list[RequestOutput]:
    """Serve one chat per question on an idle ``llm`` (prefix caching on), all with :data:`SYSTEM_PROMPT`
    rendered by ``template``, greedy; print what happened."""
    chats = [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}] for q in questions]
    prompts = render(as_conversations(chats), template, llm.tokenizer, add_generation_prompt=True)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    request_ids = [llm.add_request(ids, params) for _, ids in prompts]
    # All the chats are prefilled in the first step: look at the pool right after it.
    first = step_snapshot(llm)
    done = {o.request_id: o for o in first.finished}
    while llm.has_unfinished_requests():
        done.update((o.request_id, o) for o in llm.step() if o.finished)
    outputs = [done[r] for r in request_ids]
    for i, (question, out) in enumerate(zip(questions, outputs), 1):
        print(f"[{i}] {question}")
        print(f"    {out.outputs[0].text.strip()}")
        print(f"    ({len(out.prompt_token_ids)} prompt tokens, {out.num_cached_tokens} from the prefix cache)")

    ids = [list(i) for _, i in prompts]
    common = next((k for k, col in enumerate(zip(*ids)) if len(set(col)) > 1), min(map(len, ids)))
    shared = common // llm.block_size
    tables = [first.block_tables[s["seq_id"]] for s in first.scheduled]
    blocks = tables[0][:shared]
    holders = sum(t[:shared] == blocks for t in tables)
    print(
        f"\nThe system prompt and the turn's opening are the first {common} tokens of every chat. Their {shared} "
        f"full blocks ({shared * llm.block_size} tokens) are stored once, as physical blocks {blocks} with ref_cnt "
        f"{[first.ref_cnt[b] for b in blocks]} after the first step: {holders} of the {len(tables)} chats' block "
        f"tables start with them."
    )
    s = llm.kv_stats()
    print(
        f"Prefix cache: {s['prefix_hit_tokens']} prompt tokens served from it, {s['prefill_tokens_computed']} "
        f"computed; {s['num_preemptions']} preemptions."
    )
    print(kv_waste(outputs, llm.block_size, llm.max_model_len, shared_blocks=shared))
    return outputs


def kv_waste(outputs: Sequence[RequestOutput], block_size: int, max_model_len: int, shared_blocks: int = 0) -> str:
    """What the finished sequences' K/V take: paged (whole blocks, shared ones once) vs contiguous reservations."""
    lens = [len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outputs]
    paged = sum(cdiv(n, block_size) * block_size for n in lens)
    held = paged - (len(lens) - 1) * shared_blocks * block_size if lens else 0
    contiguous = len(lens) * max_model_len
    sharing = f"; {held} slots with the shared blocks stored once" if shared_blocks else ""
    return (
        f"KV slots for these {len(lens)} sequences at their longest: {sum(lens)} tokens. Paged allocates {paged} "
        f"({100 * (1 - sum(lens) / paged):.1f}% waste, the unfilled part of each last block){sharing}. "
        f"Contiguous would reserve {contiguous} ({100 * (1 - sum(lens) / contiguous):.1f}% waste at "
        f"max_model_len={max_model_len})."
    )


def copy_check(num_prompts: int, num_blocks: int, seed: int) -> int:
    """Serve copy prompts, half behind a shared preamble; print each one's result. Returns how many were exact."""
    rng = random.Random(seed)
    # One shared "system prompt" of 208 characters (13 full blocks of 16): half the requests use it.
    preamble = ("You are a careful copy machine. Repeat the text between the markers exactly. " * 3)[:208]
    texts = ["hello paged attention", "blocks like os pages", "kv cache 2026", "minipaged"][:num_prompts]
    texts += [task.random_text(rng) for _ in range(num_prompts - len(texts))]
    prompts = [task.prompt_for(t, preamble if i % 2 == 0 else "") for i, t in enumerate(texts)]
    llm = LLM(block_size=16, num_kvcache_blocks=num_blocks, max_num_seqs=8, enable_prefix_caching=True)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    ok = 0
    for text, prompt, out in zip(texts, prompts, outputs):
        got = out.outputs[0].text
        right = got == task.expected_completion(text)
        ok += right
        behind = f" behind the shared {len(preamble)}-character preamble" if prompt.startswith(preamble) else ""
        print(
            f"[{'ok ' if right else 'BAD'}] {text!r}{behind} -> {got!r} "
            f"({len(out.prompt_token_ids)} prompt tokens, {out.num_cached_tokens} from the prefix cache)"
        )
    print(f"{ok}/{len(texts)} completions exact")
    print(kv_waste(outputs, llm.block_size, llm.max_model_len))
    return ok
