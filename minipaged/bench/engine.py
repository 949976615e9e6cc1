"""Benchmark: the engine on a paged KV cache vs the same engine on a contiguous one, same memory.

``python -m minipaged bench engine [--requests 48] [--blocks 256] [--plot docs/figures/engine_kv_usage.png]``

One seeded synthetic workload (long-tailed prompt and output lengths, token-id prompts, outputs
of a fixed length each: ``ignore_eos``) runs through ``LLM`` twice with the same number of KV
slots: paged (blocks of 16) and contiguous (a ``max_model_len`` reservation per sequence).
Printed per engine: output tokens/s, peak concurrent sequences, and KV slots holding a live
token vs slots allocated (time-averaged over steps). With transformers installed, the same model
runs Hugging Face ``generate`` (batched, left-padded) on the same prompts for a baseline.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from minipaged import LLM, SamplingParams
from minipaged.model.loader import EMBEDDED_MODEL_DIR
from minipaged.sim import synthetic_trace, token_ids_for


@dataclass
class EngineRun:
    """What one engine did with the workload; series are per step."""

    name: str
    seconds: float = 0.0
    output_tokens: int = 0
    running: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    preemptions: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def utilization(self) -> float:
        """Slots holding a live token over slots allocated, summed over steps."""
        return sum(self.held) / max(1, sum(self.allocated))


def workload(num_requests: int, seed: int, max_model_len: int, vocab_size: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per request."""
    trace = synthetic_trace(num_requests, seed, mean_prompt=200, mean_output=100, max_len=max_model_len, sigma=0.8)
    return [(token_ids_for(r, vocab_size, seed), r.output_len) for r in trace]


def run_engine(llm: LLM, name: str, requests: list[tuple[list[int], int]], progress: bool = True) -> EngineRun:
    """Submit every request at once, step until done, record the pool every step."""
    run = EngineRun(name)
    for prompt, out_len in requests:
        llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True))
    start = time.perf_counter()
    with tqdm(total=len(requests), desc=name, disable=not progress, leave=False) as bar:
        while llm.has_unfinished_requests():
            snap = llm.step()
            stats = llm.kv_stats()
            run.running.append(len(snap.running))
            run.held.append(stats["tokens_held"])
            run.allocated.append(stats["slots_allocated"])
            bar.update(len(snap.finished))
    run.seconds = time.perf_counter() - start
    run.output_tokens = sum(n for _, n in requests)
    run.preemptions = llm.kv_stats()["num_preemptions"]
    return run


def run_transformers(model_dir, requests: list[tuple[list[int], int]], batch_size: int) -> EngineRun | None:
    """Hugging Face ``generate``, batched and left-padded; every batch runs to its longest output."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = model.config.pad_token_id or 0
    run = EngineRun("transformers")
    start = time.perf_counter()
    order = sorted(range(len(requests)), key=lambda i: len(requests[i][0]))  # similar lengths per batch
    for b in range(0, len(order), batch_size):
        batch = [requests[i] for i in order[b : b + batch_size]]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(n for _, n in batch),
                           do_sample=False, eos_token_id=None, pad_token_id=pad)
    run.seconds = time.perf_counter() - start
    run.output_tokens = sum(n for _, n in requests)
    return run


def plot(runs: list[EngineRun], budget: int, path: str) -> None:
    from minipaged.viz.style import new_figure, save_figure

    fig, (ax1, ax2) = new_figure(12, 4.5, ncols=2)
    for r in runs:
        ax1.plot(r.held, label=f"{r.name}: tokens held")
        ax1.plot(r.allocated, linestyle="--", label=f"{r.name}: slots allocated")
        ax2.plot(r.running, label=r.name)
    ax1.axhline(budget, color="black", linewidth=1)
    ax1.set(xlabel="engine step", ylabel="KV slots", title=f"KV memory ({budget} slots)")
    ax2.set(xlabel="engine step", ylabel="sequences", title="running sequences")
    ax1.legend(fontsize=10)
    ax2.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m minipaged bench engine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a local Hugging Face folder (default: the embedded model)")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--blocks", type=int, default=256, help="KV blocks of 16 tokens (the memory budget)")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-transformers", action="store_true")
    p.add_argument("--plot", default=None, help="save the KV-usage plot here (.png or .svg)")
    a = p.parse_args(argv)
    common = dict(block_size=16, num_kvcache_blocks=a.blocks, max_model_len=a.max_model_len,
                  max_num_seqs=a.max_num_seqs, attention_backend="auto")
    paged = LLM(a.model, **common)
    requests = workload(a.requests, a.seed, a.max_model_len, paged.model.config.vocab_size)
    runs = [run_engine(paged, "paged", requests), run_engine(LLM(a.model, kv_cache="contiguous", **common),
                                                              "contiguous", requests)]
    if not a.no_transformers:
        hf = run_transformers(a.model or EMBEDDED_MODEL_DIR, requests, batch_size=16)
        if hf is not None:
            runs.append(hf)
    prompt_tokens = sum(len(q) for q, _ in requests)
    print(f"workload: {len(requests)} requests (seed {a.seed}), {prompt_tokens} prompt tokens, "
          f"{runs[0].output_tokens} output tokens; KV budget {a.blocks * 16} slots "
          f"({a.blocks} blocks x 16), max_model_len {a.max_model_len}, device {paged.model.device}")
    print(f"{'engine':<13}{'tokens/s':>10}{'seconds':>9}{'peak seqs':>11}{'mean seqs':>11}"
          f"{'held/allocated':>16}{'preemptions':>13}")
    for r in runs:
        peak = max(r.running) if r.running else float("nan")
        mean = sum(r.running) / len(r.running) if r.running else float("nan")
        util = f"{100 * r.utilization:.1f}%" if r.allocated else "n/a"
        print(f"{r.name:<13}{r.tokens_per_s:>10.1f}{r.seconds:>9.1f}{peak:>11}{mean:>11.1f}{util:>16}"
              f"{r.preemptions:>13}")
    p_run, c_run = runs[0], runs[1]
    print(f"paged vs contiguous: {max(p_run.running) / max(c_run.running):.1f}x peak concurrency, "
          f"{p_run.tokens_per_s / c_run.tokens_per_s:.2f}x tokens/s, "
          f"{100 * (1 - p_run.utilization):.1f}% vs {100 * (1 - c_run.utilization):.1f}% of allocated slots unused")
    if a.plot:
        plot(runs[:2], a.blocks * 16, a.plot)
        print(f"plot saved to {a.plot}")
