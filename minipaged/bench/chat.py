"""Benchmark: the real chat model, against transformers and against the memory's speed.

``python -m minipaged bench chat [--model M] [--dtype D] [--quick] [--repeats R] [--new-tokens N]
[--chats C] [--max-tokens T]``

- **(a) tokens/s at 1, 8 and 32 concurrent chats**: short questions rendered with the model's
  chat template, greedy, every chat ``N`` new tokens (default 64; ``ignore_eos``, and
  transformers is told of no EOS), minipaged (``--dtype``, default ``auto``) against
  transformers' ``generate`` (one left-padded batch) on the same weights, in bf16 when ours
  multiplies in bf16 and in fp32 otherwise. The transformers model is built from minipaged's
  loaded weights; the tokens are compared chat by chat (in fp32 they agree; across number
  formats a near-tie may go the other way).
- **(b) the 1-row decode step against the memory's speed**: a step at one row multiplies one
  vector by every matrix of the model, so it cannot take less than the time to read the weights
  in use once (bf16 products read half the bytes of fp32). The bench measures this machine's
  *read* bandwidth in the same run (the best of a ``sum`` and a matrix-vector product over
  512 MiB: bytes read over seconds, no writes counted) and prints the median decode step of the
  1-chat run over ``weight bytes / bandwidth``.
- **(d) step time against running rows**, fp32 and ``auto`` side by side: the decode step at
  1, 8, 32 and 64 rows, and each over the 1-row step. Where the step costs about the same at 32
  rows as at 1, each extra running request is nearly free: the regime where paging's larger
  batch turns straight into throughput.
- **(c) where a decode step's time goes**, at 1 and at 32 rows: the step outside the forward
  (schedule, packing, sampling, bookkeeping), attention (every layer's KV write and attention)
  and the rest of the forward (the matrix products, norms, RoPE and activations).
- **(e) real ShareGPT chats, EOS honoured** (``--chats``, default 64, at most ``--max-tokens``
  new tokens, default 128), against transformers' ``generate``, and **(f) paged against
  contiguous** on one KV budget that holds 3 contiguous reservations, and **(g) perplexity** on
  held-out ShareGPT answers, ``auto`` against ``float32`` and transformers: see
  :mod:`minipaged.bench.sharegpt_chats`.

Every ratio is measured side by side in this one process: each engine runs ``--repeats`` times
(default 3), the two taking turns, and each one's fastest run counts (:func:`fastest_of`).
The prompts of a random model (``random:NAME``, no tokenizer) are random token ids.
"""

from __future__ import annotations

import random
import statistics
import time
from argparse import Namespace
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from minipaged.bench import parser
from minipaged.bench.engine import EngineRun, fastest_of
from minipaged.bench.sharegpt_chats import (
    against_transformers,
    engine_perplexity,
    held_out_texts,
    paged_against_contiguous,
    run_generate,
    sharegpt_chats,
    transformers_perplexity,
)
from minipaged.bench.step_timer import StepTimer
from minipaged.engine.llm import LLM
from minipaged.engine.sampling_params import SamplingParams
from minipaged.model.decoder import DecoderModel
from minipaged.model.hub import DEFAULT_CHAT_MODEL
from minipaged.paper.plots import draw_step_curve
from minipaged.viz.style import save_figure

QUESTIONS = (
    "What is the capital of France? Answer in one sentence.",
    "Why is the sky blue?",
    "Give me three tips for sleeping better.",
    "What does a compiler do?",
    "Write a haiku about autumn.",
    "How do vaccines work?",
    "Explain recursion to a child.",
    "What is the difference between weather and climate?",
    "Name three planets and one fact about each.",
    "How do I boil an egg?",
    "What is photosynthesis?",
    "Suggest a name for a grey cat.",
    "Why do leaves change colour in autumn?",
    "What is a prime number?",
    "How does a bicycle stay upright?",
    "Translate 'good morning' into Spanish and French.",
    "What causes the tides?",
    "Give me a short recipe for pancakes.",
    "What is the Pythagorean theorem?",
    "How do bees make honey?",
    "What is machine learning, in two sentences?",
    "Why is exercise good for the heart?",
    "What is the tallest mountain on Earth?",
    "How do I write a polite email asking for a day off?",
    "What is inflation?",
    "Explain what a black hole is.",
    "List four musical instruments.",
    "How does the internet send a message from one computer to another?",
    "What is the boiling point of water at sea level?",
    "Why do we have seasons?",
    "What should I pack for a weekend hike?",
    "How many legs does a spider have?",
)
READ_BYTES = 512 * 2**20
# (f)'s KV budget: 384 blocks of 16 tokens (6,144 slots) hold 3 reservations of 2,048
REAL_BUDGET = dict(num_kvcache_blocks=384, block_size=16, max_model_len=2048, max_num_seqs=64)
REAL_BUDGET_QUICK = dict(num_kvcache_blocks=128, block_size=16, max_model_len=1024, max_num_seqs=64)


def chat_prompts(llm: LLM, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` first user turns as token ids: rendered with the chat template when the tokenizer has
    one, random ids of 20-40 tokens for a model without a tokenizer."""
    tok = llm.tokenizer
    if tok is None:
        rng = random.Random(seed)
        vocab = llm.model.config.vocab_size
        return [[rng.randrange(vocab) for _ in range(rng.randint(20, 40))] for _ in range(n)]
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(n)]
    if tok.chat_template is None:
        return [tok.encode(q) for q in questions]
    turns = [[{"role": "user", "content": q}] for q in questions]
    rendered = [tok.chat_template.render(t, add_generation_prompt=True) for t in turns]
    return [tok.encode(text, add_special_tokens=False) for text in rendered]


def transformers_twin(model: DecoderModel, dtype: torch.dtype = torch.float32) -> Any:
    """A transformers ``*ForCausalLM`` holding ``model``'s weights in ``dtype``, told of no EOS."""
    import transformers

    d = model.config.to_hf_dict()
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf.load_state_dict({k: v.float() for k, v in model.state_dict().items()}, strict=True)
    hf.tie_weights()
    hf.to(dtype)
    hf.generation_config.eos_token_id = None  # every chat runs its N tokens, as ignore_eos does
    return hf


def run_minipaged(llm: LLM, prompts: Sequence[list[int]], new_tokens: int) -> EngineRun:
    """Every chat submitted at once, stepped until done; ``steps`` holds (seconds, decode rows, prefill tokens)."""
    run = EngineRun("minipaged")
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    ids = [llm.add_request(p, params) for p in prompts]
    while llm.has_unfinished_requests():
        start = time.perf_counter()
        batch, _ = llm.run_step()
        decodes = sum(1 for n in batch.q_lens if n == 1)
        run.steps.append((time.perf_counter() - start, decodes, sum(batch.q_lens) - decodes))
    run.seconds = sum(t for t, _, _ in run.steps)
    run.output_tokens = new_tokens * len(prompts)
    run.tokens = [llm.get_output(i).outputs[0].token_ids for i in ids]
    return run


def run_transformers(hf: Any, prompts: Sequence[list[int]], new_tokens: int, pad_id: int) -> EngineRun:
    """One left-padded ``generate`` batch of every chat, greedy, ``new_tokens`` each (no EOS)."""
    return run_generate(hf, prompts, new_tokens, pad_id, eos=[])


def read_bandwidth(nbytes: int = READ_BYTES, repeats: int = 5) -> float:
    """Bytes read per second over one ``nbytes`` tensor: the best of ``repeats`` runs of a ``sum``
    and of a matrix-vector product (what a 1-row step does), nothing written but the result."""
    matrix = torch.ones(nbytes // 4 // 4096, 4096)
    vector = torch.ones(4096)
    best = float("inf")
    for _ in range(repeats):
        for read in (matrix.sum, lambda: torch.mv(matrix, vector)):
            start = time.perf_counter()
            read()
            best = min(best, time.perf_counter() - start)
    return matrix.numel() * 4 / best


@dataclass
class ChatRow:
    """One concurrency level of (a): the fastest run of each engine."""

    chats: int
    ours: EngineRun
    theirs: EngineRun

    @property
    def ratio(self) -> float:
        return self.ours.tokens_per_s / self.theirs.tokens_per_s

    @property
    def identical(self) -> int:
        """Chats whose tokens are the same in both engines."""
        return sum(a == b for a, b in zip(self.ours.tokens, self.theirs.tokens))


def compare(llm: LLM, hf: Any, chats: Sequence[int], new_tokens: int, repeats: int) -> list[ChatRow]:
    """(a): for each number of chats, both engines on the same prompts, taking turns."""
    pad_id = llm.model.config.pad_token_id or 0
    rows = []
    for n in chats:
        prompts = chat_prompts(llm, n)
        runners: list[Callable[[], EngineRun]] = [
            partial(run_minipaged, llm, prompts, new_tokens),
            partial(run_transformers, hf, prompts, new_tokens, pad_id),
        ]
        ours, theirs = fastest_of(runners, repeats)
        rows.append(ChatRow(n, ours, theirs))
        print(
            f"  {n:3d} chats  minipaged {ours.tokens_per_s:7.1f}  transformers {theirs.tokens_per_s:7.1f} tokens/s  "
            f"ratio {rows[-1].ratio:.2f}x  identical tokens {rows[-1].identical}/{n} chats"
        )
    return rows


def decode_step_seconds(run: EngineRun) -> float:
    """The median step of ``run`` that held decode rows only."""
    return statistics.median(t for t, decodes, prefill in run.steps if decodes and not prefill)


def step_breakdown(llm: LLM, rows: int, steps: int) -> dict[str, float]:
    """(c): seconds per decode step at ``rows`` running chats: total, outside the forward,
    attention, and the rest of the forward."""
    params = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
    for p in chat_prompts(llm, rows):
        llm.add_request(p, params)
    llm.run_step()  # the prefill
    llm.run_step()  # one decode step untimed: the first one allocates
    with StepTimer(llm) as timer:
        for _ in range(steps):
            llm.run_step()
    while llm.has_unfinished_requests():
        llm.run_step()
    s = {k: v / steps for k, v in timer.seconds.items()}
    return {
        "step": s["total"],
        "outside the forward": s["total"] - s["forward"],
        "attention": s["attention"],
        "rest of the forward": s["forward"] - s["attention"],
    }


def main(argv: list[str] | None = None) -> dict:
    p = parser("chat", __doc__)
    p.add_argument("--model", default=DEFAULT_CHAT_MODEL, help=f"a model name or folder (default {DEFAULT_CHAT_MODEL})")
    p.add_argument("--quick", action="store_true", help="1 and 2 chats, 4 tokens, one run each: a smoke run")
    p.add_argument("--repeats", type=int, default=3, help="runs of each engine, taking turns; the fastest counts")
    p.add_argument("--new-tokens", type=int, default=64, help="new tokens of every chat (default 64)")
    p.add_argument("--dtype", default="auto", help="minipaged's number format: auto (default), float32, bfloat16")
    p.add_argument("--chats", type=int, default=64, help="(e), (f): real ShareGPT chats (default 64)")
    p.add_argument("--plot", default=None, help="save (d)'s step-against-rows figure here (.png or .svg)")
    p.add_argument("--max-tokens", type=int, default=128, help="(e), (f): new tokens at most (default 128)")
    a = p.parse_args(argv)
    quick = a.quick
    chats, new_tokens, repeats, steps = ((1, 2), 4, 1, 2) if quick else ((1, 8, 32), a.new_tokens, a.repeats, 16)
    engine_args: dict[str, Any] = dict(max_num_seqs=64, max_model_len=512, num_kvcache_blocks=64 * 16)
    llm = LLM(a.model, dtype=a.dtype, **engine_args)
    hf_dtype = torch.bfloat16 if llm.precision.kv_cache == torch.bfloat16 else torch.float32
    hf = transformers_twin(llm.model, hf_dtype)
    nbytes = llm.model.product_bytes()
    print(
        f"{a.model}: {llm.precision.name}, {nbytes / 1e6:.0f} MB of weights read a step, "
        f"{torch.get_num_threads()} CPU threads, {new_tokens} new tokens a chat, fastest of {repeats} runs each"
    )
    print(f"(a) output tokens/s, minipaged vs transformers generate (one padded batch, same weights in {hf_dtype})")
    rows = compare(llm, hf, chats, new_tokens, repeats)
    bandwidth = read_bandwidth()
    step = decode_step_seconds(rows[0].ours)
    floor = nbytes / bandwidth
    print(
        f"(b) 1-row decode step {1e3 * step:.1f} ms; reading the weights once at the read bandwidth "
        f"measured now ({bandwidth / 1e9:.1f} GB/s) takes {1e3 * floor:.1f} ms: step / bandwidth limit "
        f"{step / floor:.2f}x"
    )
    print("(c) where a decode step's time goes (ms per step)")
    breakdown = {}
    for n in (1, max(chats)):
        parts = breakdown[n] = step_breakdown(llm, n, steps)
        print(
            f"  {n:3d} rows  step {1e3 * parts['step']:6.1f}: "
            + ", ".join(f"{k} {1e3 * v:.1f} ({100 * v / parts['step']:.0f}%)" for k, v in parts.items() if k != "step")
        )
    curve_rows = [1, 2] if quick else [1, 8, 32, 64]
    curve, curve_bytes = step_curve(a.model, llm, curve_rows, engine_args, steps)
    if a.plot:
        floors = {d: n / bandwidth for d, n in curve_bytes.items()}
        save_figure(draw_step_curve(curve_rows, curve, floors, f"{a.model}: the decode step against its rows"), a.plot)
        print(f"(d) drawn with the bandwidth lines: {a.plot}")
    figures = {"rows": rows, "bandwidth": bandwidth, "weight_bytes": nbytes, "step": step, "breakdown": breakdown}
    return {**figures, "curve": curve, **real_chats(a, llm, hf)}


def real_chats(a: Namespace, llm: LLM, hf: Any) -> dict[str, Any]:
    """(e) and (f) (:mod:`minipaged.bench.sharegpt_chats`), for a model that chats."""
    if llm.tokenizer is None or llm.tokenizer.chat_template is None:
        print("(e), (f): skipped, the model has no chat template (real ShareGPT chats need one)")
        return {}
    n, max_tokens = (3, 8) if a.quick else (a.chats, a.max_tokens)
    budget = dict(REAL_BUDGET_QUICK if a.quick else REAL_BUDGET)
    # the defaults a user gets, with room for a real first turn and its answer
    chats = LLM(a.model, dtype=a.dtype, max_num_seqs=64, max_model_len=budget["max_model_len"])
    prompts = sharegpt_chats(chats, n)
    print(f"(e) {n} real ShareGPT first turns, EOS honoured, at most {max_tokens} new tokens each")
    e = against_transformers(chats, hf, prompts, max_tokens)
    print(
        f"  minipaged {e.first.tokens_per_s:.1f} tokens/s ({e.first.output_tokens} tokens), transformers "
        f"{e.second.tokens_per_s:.1f} ({e.second.output_tokens}): ratio {e.ratio:.2f}x, "
        f"identical {e.identical}/{n} chats"
    )
    fits = budget["num_kvcache_blocks"] * budget["block_size"] // budget["max_model_len"]
    print(
        f"(f) paged against contiguous (reserving max_model_len={budget['max_model_len']} a chat: {fits} at a time) "
        f"on {budget['num_kvcache_blocks']} blocks of {budget['block_size']} tokens, the same chats"
    )
    f = paged_against_contiguous(a.model, prompts, max_tokens, a.dtype, budget)
    print(
        f"  paged {f.first.tokens_per_s:.1f} tokens/s, contiguous {f.second.tokens_per_s:.1f}: ratio {f.ratio:.2f}x, "
        f"identical {f.identical}/{n} chats"
    )
    return {"sharegpt": e, "paged_vs_contiguous": f, "perplexity": quality(a, llm, 3 if a.quick else 24)}


def quality(a: Namespace, llm: LLM, n: int) -> dict[str, float]:
    """(g): perplexity on held-out ShareGPT answers, the engine in ``auto`` and ``float32`` (through
    its paged path) and transformers' forward in fp32 and bf16, on the same weights."""
    texts = held_out_texts(llm, n)
    engines = {"auto": llm if a.dtype == "auto" else LLM(a.model, dtype="auto", max_model_len=512)}
    engines["float32"] = llm if a.dtype == "float32" else LLM(a.model, dtype="float32", max_model_len=512)
    ppl = {f"minipaged {d}": engine_perplexity(e, texts) for d, e in engines.items()}
    for dtype in (torch.float32, torch.bfloat16):
        ppl[f"transformers {str(dtype).removeprefix('torch.')}"] = transformers_perplexity(
            transformers_twin(llm.model, dtype), texts
        )
    change = ppl["minipaged auto"] / ppl["minipaged float32"] - 1
    print(
        f"(g) perplexity on {len(texts)} held-out ShareGPT answers ({sum(len(t) for t in texts)} tokens): "
        + ", ".join(f"{k} {v:.3f}" for k, v in ppl.items())
        + f"; auto against float32 {100 * change:+.2f}%"
    )
    return ppl


def step_curve(
    model: str, llm: LLM, rows: Sequence[int], engine_args: dict, steps: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """(d): seconds per decode step at each number of ``rows``, fp32 and ``auto`` (``llm`` is one of
    them, the other is built here), printed with each over its own 1-row step; and the bytes of
    weights each one's step reads."""
    others = {"float32", "auto"} - {"auto" if llm.precision.bf16_products else "float32"}
    engines = {("auto" if llm.precision.bf16_products else "float32"): llm}
    engines.update({d: LLM(model, dtype=d, **engine_args) for d in others})
    engines = {d: engines[d] for d in ("float32", "auto")}
    curve = {d: [step_breakdown(e, n, steps)["step"] for n in rows] for d, e in engines.items()}
    print("(d) decode step against running rows (ms; x the 1-row step)")
    for i, n in enumerate(rows):
        parts = [f"{d} {1e3 * c[i]:6.1f} ({c[i] / c[0]:.2f}x)" for d, c in curve.items()]
        print(f"  {n:3d} rows  " + "  ".join(parts))
    return curve, {d: e.model.product_bytes() for d, e in engines.items()}
