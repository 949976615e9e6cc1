"""Fig. 18b: the block size, from 1 to 256 tokens (memory simulated, throughput measured).

Small blocks waste little memory (only the last block of a sequence is partly empty) but make
block tables long and every gather short; large blocks waste up to a block per sequence and
share less. The paper measures end-to-end latency on an A100 and settles on 16 (16-128 best on
ShareGPT, 16-32 on Alpaca, whose short sequences feel a large last block most).

Here: the share of KV memory holding tokens at each block size, replayed as in Fig. 2 on
ShareGPT-shaped (lognormal), real ShareGPT and Alpaca-shaped lengths; and the engine's tokens/s
at each block size with ``random:smollm2-135m`` on Alpaca-shaped requests, the same 1,024 slots
of KV memory split into blocks of that size.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from minipaged.paper.engine_run import run_engine
from minipaged.paper.engines import BUDGET, MODEL, make_llm, vocab_size, warm_up
from minipaged.paper.report import PaperResult
from minipaged.paper.reservation import MAX_LEN, OPT13B_A100_SLOTS, saturated_shares
from minipaged.paper.serving import alpaca_requests
from minipaged.paper.workloads import TRACES, trace_for
from minipaged.sim import PagedReplay, replay

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ENGINE_BLOCK_SIZES = (1, 4, 16, 64, 256)  # every other one: each is a run of the real engine
PAPER: dict[str, int | str] = {"default": 16, "best_sharegpt": "16-128", "best_alpaca": "16-32"}


def block_size_sweep(
    block_sizes: tuple[int, ...] = BLOCK_SIZES,
    sharegpt_requests: int = 400,
    alpaca_requests_sim: int = 1000,
    engine_requests: int = 16,
    engine_block_sizes: tuple[int, ...] = ENGINE_BLOCK_SIZES,
    max_output: int | None = None,
    model: str | None = MODEL,
    quick: bool = False,
) -> PaperResult:
    res = PaperResult("fig18b", "Fig. 18b: block size, memory holding tokens and throughput", "measured", quick=quick)
    sim_requests = {"sharegpt": sharegpt_requests, "sharegpt-real": sharegpt_requests, "alpaca": alpaca_requests_sim}
    slots = BUDGET["num_kvcache_blocks"] * BUDGET["block_size"]
    res.settings = {
        "sim_slots": OPT13B_A100_SLOTS,
        "sim_requests": sim_requests,
        "model": model,
        "engine_slots": slots,
        "engine_requests": engine_requests,
        "max_model_len": BUDGET["max_model_len"],
        "max_output": max_output,
    }
    memory: dict[str, dict[str, float]] = {}
    for key, n in sim_requests.items():
        trace = trace_for(key, n, 0, max_len=MAX_LEN)
        memory[key] = {}
        for b in tqdm(block_sizes, desc=f"fig18b memory ({key})", leave=False):
            blocks = OPT13B_A100_SLOTS // b
            memory[key][str(b)] = saturated_shares(replay(trace, PagedReplay(blocks, b)).series, blocks * b)["tokens"]
    requests = alpaca_requests(engine_requests, vocab_size(model), 0, max_output)
    throughput: dict[str, float] = {}
    tokens: dict[int, list[list[int]]] = {}
    for b in tqdm(engine_block_sizes, desc="fig18b engine", leave=False):
        llm = make_llm(
            "paged", model, block_size=b, num_kvcache_blocks=slots // b, max_model_len=BUDGET["max_model_len"]
        )
        warm_up(llm)
        run = run_engine(llm, f"block {b}", requests)
        throughput[str(b)], tokens[b] = run.tokens_per_s, run.tokens
    res.data = {"memory_tokens_share": memory, "tokens_per_s": throughput}
    for key, shares in memory.items():
        for size, share in shares.items():
            res.add(f"{TRACES[key]}, block {size}: memory holding tokens", 100 * share, unit="%")
    for size, value in throughput.items():
        res.add(f"engine, block {size}: tokens/s", value)
    best = max(throughput, key=lambda size: throughput[size])
    same = all(t == tokens[engine_block_sizes[0]] for t in tokens.values())
    res.data["best_block_size"], res.data["tokens_identical"] = int(best), same
    res.add("engine: fastest block size", int(best), PAPER["default"])
    res.notes.append(f"the same tokens at every block size: {same}")
    res.notes.append(
        f"paper: {PAPER['best_sharegpt']} best on ShareGPT, {PAPER['best_alpaca']} on Alpaca (latency on an A100)"
    )
    return res
