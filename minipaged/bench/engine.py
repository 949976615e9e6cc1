"""Benchmark: is the engine fast *because* it is paged? Four figures from one run.

``python -m minipaged bench engine [--quick] [--plot FILE]``

- **(a) vs transformers**: 48 requests (prompts 16-200 tokens, outputs 8-128, greedy,
  ``ignore_eos``) on a random 4-layer tiny Qwen3 (hidden 128, 8 query / 2 KV heads, head_dim
  16, vocab 512) built here with transformers: minipaged's tokens/s over Hugging Face's batched,
  left-padded ``generate`` (batches of 16 prompts of similar length), tokens compared.
- **(b) paged vs contiguous, tight budget**: the same requests on 64 blocks x 16 slots with
  ``max_model_len`` 512: a contiguous reservation is 512 slots, so only 2 sequences fit.
- **(c) paged vs contiguous, embedded model**: 48 copy prompts (preambles of 40-400
  characters, 20-200 output tokens) on 256 blocks x 16.
- **(d) the step's time split** (schedule / prepare / forward / sample / other) at 32 running
  decodes: how much of a step is spent outside the model.

Every ratio is measured side by side in this one process: each engine runs ``--repeats`` times
(default 3), the engines taking turns, and each one's fastest run counts. Only the engine's own
work is timed (schedule, run, sample, postprocess); the figures recorded between steps are not.

For (b) and (c) a **step cost model** is fitted to every step of both engines:
``seconds = F + m x decode rows + p x prefill tokens`` (least squares). With it the bench says
where the time goes, and what the best paged run could take: as few steps as the pool allows
(every sequence's slots summed over its steps, divided by the pool's slots) and no tokens
recomputed after preemption; and what the ratio would be if a step cost the same whatever its
rows, as it nearly does on a GPU at these sizes: contiguous steps over paged steps.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from minipaged.bench import parser
from minipaged.bench.step_timer import StepTimer
from minipaged.engine import inputs
from minipaged.engine.llm import LLM
from minipaged.engine.sampling_params import SamplingParams
from minipaged.paper.engine_run import EngineRun, WorkItem, fastest_of, run_engine
from minipaged.paper.step_cost import StepCost
from minipaged.paper.workloads import copy_workload
from minipaged.utils import cdiv

TokenItem = tuple[list[int], int]  # (prompt token ids, output length): what transformers is given


def random_qwen3(folder: Path, seed: int = 0) -> Path:
    """Save a random tiny Qwen3 (4 layers, hidden 128, 8/2 heads, head_dim 16, vocab 512) to ``folder``."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        initializer_range=0.5,
    )
    model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # random norm weights: a model that repeats one token proves nothing
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    model.save_pretrained(folder)
    return folder


def token_workload(n: int, seed: int, vocab: int) -> list[TokenItem]:
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(16, 200))], rng.randint(8, 128)) for _ in range(n)]


def run_transformers(model_dir: Path, requests: Sequence[TokenItem], batch_size: int = 16) -> EngineRun:
    """Hugging Face ``generate``, batched and left-padded; every batch runs to its longest output."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    run = EngineRun("transformers")
    run.tokens = [[] for _ in requests]
    order = sorted(range(len(requests)), key=lambda i: len(requests[i][0]))  # similar lengths per batch
    start = time.perf_counter()
    for b in tqdm(range(0, len(order), batch_size), desc="transformers", leave=False):
        idx = order[b : b + batch_size]
        batch = [requests[i] for i in idx]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max(n for _, n in batch),
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        for row, (i, (_, n)) in enumerate(zip(idx, batch)):
            run.tokens[i] = out[row, width : width + n].tolist()
    run.seconds = time.perf_counter() - start
    run.output_tokens = sum(n for _, n in requests)
    return run


def table(runs: list[EngineRun]) -> None:
    print(
        f"  {'engine':<14}{'tokens/s':>10}{'seconds':>9}{'peak seqs':>11}{'mean seqs':>11}"
        f"{'held/allocated':>16}{'preemptions':>13}"
    )
    for r in runs:
        peak = f"{max(r.running)}" if r.running else "-"
        mean = f"{sum(r.running) / len(r.running):.1f}" if r.running else "-"
        util = f"{100 * r.utilization:.1f}%" if r.stats else "-"
        print(
            f"  {r.name:<14}{r.tokens_per_s:>10.1f}{r.seconds:>9.2f}{peak:>11}{mean:>11}{util:>16}"
            f"{r.preemptions if r.running else '-':>13}"
        )


def fewest_steps(lengths: list[tuple[int, int]], block_size: int, num_slots: int) -> int:
    """A lower bound on the steps a pool of ``num_slots`` needs for requests of
    ``(prompt tokens, output tokens)``: each step holds at most ``num_slots`` slots, and a
    request holds ``block_size x ceil(tokens / block_size)`` slots in each of its steps."""
    held = sum(block_size * cdiv(p + t, block_size) for p, n in lengths for t in range(n))
    return max(cdiv(held, num_slots), max(n for _, n in lengths))


def explain(
    paged: EngineRun, contiguous: EngineRun, lengths: list[tuple[int, int]], block_size: int, num_slots: int
) -> StepCost:
    """Print the fitted step cost, where each engine's time goes, and the best paged run's ratio."""
    cost = StepCost.fit([paged, contiguous])
    print(
        f"  step cost (fitted to both engines' {len(paged.steps) + len(contiguous.steps)} steps): "
        f"{1e3 * cost.per_step:.2f} ms per step + {1e6 * cost.per_decode:.0f} us per decode row "
        f"+ {1e6 * cost.per_prefill:.0f} us per prefill token"
    )
    for r in (paged, contiguous):
        prefill = sum(p for _, _, p in r.steps)
        print(
            f"    {r.name:<11} {len(r.steps):5d} steps ({1e3 * cost.per_step * len(r.steps):5.0f} ms), "
            f"{sum(d for _, d, _ in r.steps):5d} decode rows, {prefill:6d} prefill tokens "
            f"({1e3 * cost.per_prefill * prefill:4.0f} ms)"
        )
    steps = fewest_steps(lengths, block_size, num_slots)
    best = cost.seconds(steps + 1, sum(d for _, d, _ in paged.steps), sum(p for p, _ in lengths))
    print(
        f"  at these costs, a paged run in the fewest steps this pool allows ({steps}) with nothing "
        f"recomputed would take {best:.2f} s: contiguous time / paged time {contiguous.seconds / best:.2f}x"
    )
    # On a GPU a step of a model this small costs nearly the same at 2 rows as at 20 (kernel
    # launches and weight reads dominate), so there the time ratio tends to the step ratio.
    print(
        f"  if a step cost the same whatever its rows: contiguous time / paged time "
        f"{len(contiguous.steps) / len(paged.steps):.2f}x for these runs, "
        f"{len(contiguous.steps) / steps:.2f}x in the fewest steps"
    )
    return cost


def paged_vs_contiguous(
    model: str | Path | None, requests: Sequence[WorkItem], repeats: int = 1, **kw: Any
) -> tuple[EngineRun, EngineRun]:
    paged_llm, contiguous_llm = LLM(model, **kw), LLM(model, kv_layout="contiguous", **kw)
    paged, contiguous = fastest_of(
        [
            lambda: run_engine(paged_llm, "paged", requests, record=True),
            lambda: run_engine(contiguous_llm, "contiguous", requests, record=True),
        ],
        repeats,
    )
    table([paged, contiguous])
    same = paged.tokens == contiguous.tokens
    print(
        f"  paged / contiguous: {paged.tokens_per_s / contiguous.tokens_per_s:.2f}x tokens/s "
        f"(contiguous time / paged time {contiguous.seconds / paged.seconds:.2f}x), "
        f"{max(paged.running) / max(contiguous.running):.1f}x peak sequences; tokens identical: {same}"
    )
    lengths = [(len(inputs.encode(p, i, paged_llm.tokenizer)[1]), n) for i, (p, n) in enumerate(requests)]
    explain(paged, contiguous, lengths, paged_llm.block_size, paged_llm.num_blocks * paged_llm.block_size)
    return paged, contiguous


def step_split(model: str | Path | None, num_seqs: int, decode_steps: int) -> dict[str, float]:
    """Share of step time per phase over ``decode_steps`` steps of ``num_seqs`` running decodes."""
    llm = LLM(model, max_num_seqs=num_seqs, max_model_len=512, num_kvcache_blocks=num_seqs * 8)
    rng = random.Random(0)
    for _ in range(num_seqs):
        prompt = [rng.randrange(llm.model.config.vocab_size) for _ in range(32)]
        llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=decode_steps + 8, ignore_eos=True))
    llm.step()  # the prefill of all of them
    with StepTimer(llm) as timer:
        for _ in range(decode_steps):
            llm.run_step()
    return timer.shares()


def plot(paged: EngineRun, contiguous: EngineRun, budget: int, path: str) -> None:
    from minipaged.viz.scheduler import draw_kv_usage
    from minipaged.viz.style import save_figure

    fig = draw_kv_usage(paged.stats, contiguous.stats, budget, running=(paged.running, contiguous.running))
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    p = parser("engine", __doc__)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="12 requests per workload: a smoke run, not the figures")
    p.add_argument("--repeats", type=int, default=3, help="runs of each engine, taking turns; the fastest counts")
    p.add_argument("--plot", default=None, help="save the KV-usage plot of (c) here (.png or .svg)")
    a = p.parse_args(argv)
    n, repeats = (12, 1) if a.quick else (a.requests, a.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        qwen = random_qwen3(Path(tmp))
        requests = token_workload(n, a.seed, vocab=512)
        print(
            f"(a) {n} requests, {sum(len(q) for q, _ in requests)} prompt / {sum(m for _, m in requests)} output "
            f"tokens, random 4-layer tiny Qwen3, {torch.get_num_threads()} CPU threads"
        )
        llm = LLM(qwen, max_num_seqs=64, max_model_len=512)
        runners = [lambda: run_engine(llm, "minipaged", requests), lambda: run_transformers(qwen, requests)]
        ours, hf = fastest_of(runners, repeats)
        table([ours, hf])
        same = sum(x == y for x, y in zip(ours.tokens, hf.tokens))
        print(
            f"  minipaged / transformers: {ours.tokens_per_s / hf.tokens_per_s:.2f}x tokens/s; "
            f"{same}/{len(requests)} requests with identical tokens"
        )
        print("(b) the same requests, 64 blocks x 16 slots, max_model_len 512")
        paged_vs_contiguous(qwen, requests, repeats, num_kvcache_blocks=64, max_model_len=512, max_num_seqs=64)
        split = step_split(qwen, num_seqs=32, decode_steps=8 if a.quick else 40)
    copies = copy_workload(n, a.seed)
    print(f"(c) {n} copy prompts (preambles 40-400 characters, 20-200 output tokens), embedded model, 256 blocks x 16")
    paged, contiguous = paged_vs_contiguous(None, copies, repeats, num_kvcache_blocks=256, max_num_seqs=64)
    print(
        "(d) one step at 32 running decodes, share of time: "
        + ", ".join(f"{k} {100 * v:.1f}%" for k, v in split.items())
        + f"; outside the model forward {100 * (1 - split['forward']):.1f}%"
    )
    if a.plot:
        plot(paged, contiguous, 256 * 16, a.plot)
        print(f"plot saved to {a.plot}")
