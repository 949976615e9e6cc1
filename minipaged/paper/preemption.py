"""Fig. 19 / §7.3: swapping against recomputation when the pool runs out (measured).

When a step needs a block and none is free, the newest sequence is preempted. **Recompute**
frees its blocks and later prefills its whole sequence again; **swap** copies its blocks to
CPU memory and later copies them back. The paper (A100, PCIe) finds swapping expensive at
small blocks (many small transfers), recomputation flat across block sizes, and the two
comparable from 16 to 64.

Here both modes serve the same Alpaca-shaped requests on one tight pool (512 slots unless
said otherwise) at each block size. A step's time is fitted, over both modes' steps at that block size, as
``F + m x decode rows + p x prefill tokens + s x blocks swapped (in or out)``: ``s`` is the
time per swapped block, and ``p x block_size`` the time to recompute a block's tokens. On a CPU
a "swap" is a copy between two tensors in the same memory, so the per-transfer overhead is
Python's and torch's, not a bus's.
"""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from minipaged.engine.llm import LLM
from minipaged.paper.engine_run import EngineRun, run_engine
from minipaged.paper.engines import BUDGET, MODEL, vocab_size, warm_up
from minipaged.paper.report import PaperResult
from minipaged.paper.serving import alpaca_requests

BLOCK_SIZES = (4, 16, 64)
PAPER = {"comparable_block_sizes": "16-64"}


def _swapped_per_step(run: EngineRun) -> list[int]:
    """Blocks swapped out or in at each step of ``run`` (its ``stats`` are cumulative)."""
    totals = [s.get("swapped_out_blocks", 0) + s.get("swapped_in_blocks", 0) for s in run.stats]
    return [b - a for a, b in zip([0, *totals], totals)]


def _fit(runs: list[EngineRun]) -> dict[str, float]:
    """Least squares of step seconds on (1, decode rows, prefill tokens, blocks swapped)."""
    x, y = [], []
    for run in runs:
        for (seconds, decodes, prefill), swapped in zip(run.steps, _swapped_per_step(run)):
            x.append([1.0, decodes, prefill, swapped])
            y.append([seconds])
    sol = torch.linalg.lstsq(torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)).solution
    return dict(zip(("per_step", "per_decode", "per_prefill", "per_swapped_block"), sol.flatten().tolist()))


def swap_vs_recompute(
    block_sizes: tuple[int, ...] = BLOCK_SIZES,
    num_requests: int = 16,
    max_output: int | None = None,
    model: str | None = MODEL,
    slots: int = BUDGET["num_kvcache_blocks"] * BUDGET["block_size"] // 2,
    quick: bool = False,
) -> PaperResult:
    res = PaperResult("fig19", "Fig. 19: swap against recompute, per preempted block", "measured", quick=quick)
    requests = alpaca_requests(num_requests, vocab_size(model), 0, max_output)
    prompt_tokens = sum(len(p) for p, _ in requests)
    res.settings = {"model": model, "slots": slots, "requests": num_requests, "max_output": max_output}
    rows: dict[str, dict[str, Any]] = {}
    for b in tqdm(block_sizes, desc="fig19", leave=False):
        runs: dict[str, EngineRun] = {}
        for mode in ("recompute", "swap"):
            llm = LLM(
                model,
                block_size=b,
                num_kvcache_blocks=slots // b,
                max_model_len=BUDGET["max_model_len"],
                preemption_mode=mode,  # swap: a host pool as large as the device's (the default)
            )
            warm_up(llm)
            runs[mode] = run_engine(llm, mode, requests, record=True)
        cost = _fit(list(runs.values()))
        recomputed = sum(p for _, _, p in runs["recompute"].steps) - prompt_tokens
        rows[str(b)] = {
            "seconds_per_swapped_block": cost["per_swapped_block"],
            "seconds_per_recomputed_block": cost["per_prefill"] * b,
            "swapped_blocks": sum(_swapped_per_step(runs["swap"])),
            "recomputed_blocks": recomputed / b,
            "seconds": {m: r.seconds for m, r in runs.items()},
            "tokens_identical": runs["swap"].tokens == runs["recompute"].tokens,
            "step_cost": cost,
        }
    res.data["block_sizes"] = rows
    for size, r in rows.items():
        res.add(f"block {size}: swap, ms per block", 1e3 * r["seconds_per_swapped_block"])
        res.add(f"block {size}: recompute, ms per block", 1e3 * r["seconds_per_recomputed_block"])
        ratio = r["seconds"]["recompute"] / r["seconds"]["swap"]
        res.add(f"block {size}: recompute time / swap time (end to end)", ratio)
    res.notes.append(f"paper: the two comparable at block sizes {PAPER['comparable_block_sizes']}")
    return res
