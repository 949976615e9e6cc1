"""Benchmark: KV memory of contiguous reservations vs paged blocks, replayed without a model.

``python -m minipaged bench memory [--requests 200] [--slots 4096] [--block-size 16] [--max-seq-len 512]``

A seeded synthetic trace (long-tailed lengths, Poisson arrivals) is replayed through stage 0's
first-fit arena (reserving ``max_seq_len`` per request, or exactly prompt + output: an oracle)
and through the block pool and block tables of stages 1-2, all with the same number of slots
(:func:`minipaged.sim.simulate_contiguous_vs_paged`). Printed per system: share of
allocated memory holding tokens, steps to serve the trace, mean/peak running requests,
mean external fragmentation, preemptions.
"""

from __future__ import annotations

import torch

from minipaged.bench import parser
from minipaged.engine.config import CPU_KV_CACHE_MEMORY, block_nbytes
from minipaged.model.random_models import random_model_config
from minipaged.sim import simulate_contiguous_vs_paged, synthetic_trace


def main(argv: list[str] | None = None) -> None:
    p = parser("memory", __doc__)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--slots", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--mean-prompt", type=float, default=128)
    p.add_argument("--mean-output", type=float, default=64)
    p.add_argument("--arrival-rate", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    trace = synthetic_trace(
        a.requests,
        a.seed,
        mean_prompt=a.mean_prompt,
        mean_output=a.mean_output,
        max_len=a.max_seq_len,
        arrival_rate=a.arrival_rate,
    )
    print(
        f"trace: {a.requests} requests (seed {a.seed}), mean prompt {a.mean_prompt:g}, mean output "
        f"{a.mean_output:g}, max_seq_len {a.max_seq_len}; {a.slots} KV slots each"
    )
    print(
        f"{'system':<34}{'holding tokens':>15}{'steps':>7}{'mean/peak running':>19}{'mean ext. frag.':>16}"
        f"{'preemptions':>13}"
    )
    for reserve in ("max", "exact"):
        r = simulate_contiguous_vs_paged(trace, a.slots, a.block_size, a.max_seq_len, reserve=reserve)
        rows = [(f"contiguous, reserve {'max_seq_len' if reserve == 'max' else 'exact (oracle)'}", "contiguous")]
        if reserve == "max":
            rows.append((f"paged, {a.slots // a.block_size} blocks of {a.block_size}", "paged"))
        for label, key in rows:
            t = r["totals"][key]
            frag = r[key]["external_fragmentation"][: max(t["steps"], 1)]
            print(
                f"{label:<34}{100 * t['token_utilization']:>14.1f}%{t['steps']:>7}"
                f"{t['mean_running']:>12.1f} / {t['peak_running']:<4}{100 * sum(frag) / len(frag):>15.1f}%"
                f"{t['preemptions']:>13}"
            )
    kv_dtype_line(a.block_size)


def kv_dtype_line(block_size: int) -> None:
    """What the number format does to the same memory: SmolLM2-135M's KV blocks in fp32 and in
    bf16 (``dtype="auto"`` on a CPU that multiplies bf16), in the engine's default CPU budget."""
    config = random_model_config("random:smollm2-135m")
    sizes = {
        d: block_nbytes(config, block_size, dtype) for d, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    }
    budget = CPU_KV_CACHE_MEMORY
    print(
        f"SmolLM2-135M's KV cache in {budget / 2**30:g} GiB, blocks of {block_size}: "
        + ", ".join(f"{d} {budget // n:,} blocks ({budget // n * block_size:,} tokens)" for d, n in sizes.items())
        + f": {sizes['fp32'] // sizes['bf16']}x the blocks in bf16"
    )
