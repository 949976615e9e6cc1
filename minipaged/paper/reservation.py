"""Fig. 2 and Fig. 13: what reserving contiguous memory costs, replayed without a model (simulated).

The paper's baselines are Orca with three reservation rules: **Max** reserves the model's whole
context (2,048 tokens for OPT-13B) per request, **Pow2** the next power of two of prompt +
output, **Oracle** exactly prompt + output (it knows every output length in advance). vLLM
(paged) takes a block of 16 slots whenever the last one fills.

Here each system replays the same trace on the same KV memory, twice for ShareGPT: lognormal
lengths with the paper's means, and the real file's lengths (:mod:`minipaged.paper.sharegpt`:
the real model's tokens, vLLM's sampling and filter). The memory is
what an A100-40GB has left beside OPT-13B's weights, 14,640 slots (12 x 10^9 bytes at 819,200 bytes a token;
seven 2,048-token reservations fit, as in the paper, where Orca (Max) batches 7.00 requests).
Every request arrives at once, so there is always a queue and each system holds as many
requests as its memory allows; figures are averaged over the steps with a queue waiting.

- Fig. 2: where the memory goes. *Token states* hold a token; *reservation* is allocated for
  this request's later tokens; *internal fragmentation* is allocated and never filled (beyond
  the output's end); *free* is memory no waiting request could use (holes too small, or less
  than a block of room).
- Fig. 13: how many requests run at once (the batch size).
"""

from __future__ import annotations

from functools import lru_cache

from minipaged.paper.kv_bytes import A100_KV_SLOTS
from minipaged.paper.report import PaperResult
from minipaged.paper.workloads import SYSTEM_LABELS, TRACES, mean_lengths, trace_for
from minipaged.sim import ContiguousReplay, PagedReplay, replay

OPT13B_A100_SLOTS = A100_KV_SLOTS  # 12 GB (10^9 bytes) of KV at 819,200 bytes a token, in whole blocks of 16
MAX_LEN = 2048  # OPT-13B's context: what Orca (Max) reserves
SEEDS = (0, 1, 2)
SYSTEMS = {  # our name -> (the paper's name, the replay's reservation rule; None = paged)
    name: (SYSTEM_LABELS[name], reserve)
    for name, reserve in (("orca-max", "max"), ("orca-pow2", "pow2"), ("orca-oracle", "exact"), ("paged", None))
}
PAPER_FIG2 = {"orca-max": 20.4, "orca-pow2": 26.8, "orca-oracle": 38.2, "paged": 96.3}  # % holding tokens
REAL_NOTE = (
    "real lengths: the package index's ShareGPT copy (cut: its complete records only) in SmolLM2's tokens, "
    "sampled and filtered as vLLM's serving benchmark does; the paper's are OPT's tokens of the whole file. "
    "Alpaca has no copy on the package index: its trace stays lognormal"
)
PAPER_FIG13 = {  # mean batch size (ShareGPT at 2 requests/s, Alpaca at 30 requests/s)
    "sharegpt": {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "paged": 30.42},
    "alpaca": {"orca-max": 7.00, "orca-pow2": 43.24, "orca-oracle": 72.75, "paged": 132.44},
}


@lru_cache(maxsize=8)
def memory_breakdown(
    trace: str,
    num_requests: int,
    seeds: tuple[int, ...] = SEEDS,
    num_slots: int = OPT13B_A100_SLOTS,
    block_size: int = 16,
) -> dict:
    """Replay saturated traces ``trace`` (a key of :data:`~minipaged.paper.workloads.TRACES`, one per
    seed) through the four systems; average over the seeds.

    Returns ``{"trace": {...}, system: {"tokens", "reservation", "internal", "free" (shares of all
    KV memory, summing to 1), "batch" (mean running requests), "batch_range" (lowest and highest
    seed)}}``, each averaged over the steps when a request was waiting. One seed's long tail can
    move a figure by 5%: the seeds' mean is steadier. Cached: Fig. 2 and Fig. 13 share the replays.
    """
    runs = [_breakdown_one(trace, num_requests, seed, num_slots, block_size) for seed in seeds]
    out: dict = {"trace": {"requests": num_requests, "seeds": list(seeds), **runs[0]["trace"]}}
    for name in SYSTEMS:
        per_seed = [r[name] for r in runs]
        out[name] = {k: sum(d[k] for d in per_seed) / len(runs) for k in per_seed[0]}
        out[name]["batch_range"] = [min(d["batch"] for d in per_seed), max(d["batch"] for d in per_seed)]
    return out


def _breakdown_one(name: str, num_requests: int, seed: int, num_slots: int, block_size: int) -> dict:
    trace = trace_for(name, num_requests, seed, max_len=MAX_LEN)
    out: dict = {"trace": mean_lengths(trace)}
    for name, (_, reserve) in SYSTEMS.items():
        system = (
            PagedReplay(num_slots // block_size, block_size)
            if reserve is None
            else ContiguousReplay(num_slots, MAX_LEN, reserve)
        )
        out[name] = saturated_shares(replay(trace, system).series, num_slots)
    return out


def saturated_shares(series: dict[str, list[float]], num_slots: int) -> dict[str, float]:
    """Where a replayed system's memory went, averaged over the steps with a request waiting:
    shares of all ``num_slots`` (``tokens``, ``reservation``, ``internal``, ``free``) and the mean ``batch``."""
    busy = [t for t, q in enumerate(series["queue_len"]) if q > 0]
    if not busy:
        raise ValueError(f"the trace never filled {num_slots} slots: give it more requests")
    pool = num_slots * len(busy)
    used, future, allocated = (
        sum(series[k][t] for t in busy) for k in ("used_slots", "future_slots", "allocated_slots")
    )
    return {
        "tokens": used / pool,
        "reservation": future / pool,
        "internal": (allocated - used - future) / pool,
        "free": 1 - allocated / pool,
        "batch": sum(series["running"][t] for t in busy) / len(busy),
    }


def _settings(num_slots: int, block_size: int, requests: dict[str, int]) -> dict:
    return {"num_slots": num_slots, "block_size": block_size, "max_len": MAX_LEN, "requests": requests}


def memory_waste(
    num_requests: int = 1000, seeds: tuple[int, ...] = SEEDS, num_slots: int = OPT13B_A100_SLOTS, quick: bool = False
) -> PaperResult:
    """Fig. 2: the share of KV memory holding tokens, on ShareGPT-shaped and on real ShareGPT lengths.

    ``data[system]`` is the lognormal trace's breakdown, ``data["sharegpt-real"][system]`` the real one's.
    """
    res = PaperResult("fig2", "Fig. 2: share of KV memory holding tokens (ShareGPT)", "simulated", quick=quick)
    res.settings = _settings(num_slots, 16, {"sharegpt": num_requests, "sharegpt-real": num_requests})
    res.data = memory_breakdown("sharegpt", num_requests, tuple(seeds), num_slots)
    res.data["sharegpt-real"] = memory_breakdown("sharegpt-real", num_requests, tuple(seeds), num_slots)
    for key, runs in (("sharegpt", res.data), ("sharegpt-real", res.data["sharegpt-real"])):
        for name, (label, _) in SYSTEMS.items():
            res.add(f"{TRACES[key]}, {label}, holding tokens", 100 * runs[name]["tokens"], PAPER_FIG2[name], "%")
    for key, runs in (("sharegpt", res.data), ("sharegpt-real", res.data["sharegpt-real"])):
        for name, (label, _) in SYSTEMS.items():
            d = runs[name]
            res.notes.append(
                f"{TRACES[key]}, {label}: reserved for later tokens {100 * d['reservation']:.1f}%, never filled "
                f"{100 * d['internal']:.1f}%, free but unusable {100 * d['free']:.1f}%"
            )
        t = runs["trace"]
        res.notes.append(
            f"{TRACES[key]}: {num_requests} requests, mean prompt {t['prompt']:.1f} / output {t['output']:.1f} "
            f"tokens, mean of {len(seeds)} seed{'s' * (len(seeds) > 1)}"
        )
    res.notes.append(REAL_NOTE)
    return res


def batch_size(
    sharegpt_requests: int = 1000,
    alpaca_requests: int = 2000,
    seeds: tuple[int, ...] = SEEDS,
    num_slots: int = OPT13B_A100_SLOTS,
    quick: bool = False,
) -> PaperResult:
    """Fig. 13: mean batch size of the four systems on every trace (memory-bound: a queue always waits)."""
    res = PaperResult("fig13", "Fig. 13: mean batch size (requests running at once)", "simulated", quick=quick)
    sizes = {"sharegpt": sharegpt_requests, "sharegpt-real": sharegpt_requests, "alpaca": alpaca_requests}
    res.settings = _settings(num_slots, 16, sizes)
    for key, n in sizes.items():
        res.data[key] = memory_breakdown(key, n, tuple(seeds), num_slots)
        paper = PAPER_FIG13[key.removesuffix("-real")]
        for name, (label, _) in SYSTEMS.items():
            res.add(f"{TRACES[key]}, {label}", res.data[key][name]["batch"], paper[name])
        ratio = res.data[key]["paged"]["batch"] / res.data[key]["orca-max"]["batch"]
        res.add(f"{TRACES[key]}, paged / Orca (Max)", ratio, paper["paged"] / paper["orca-max"], "x")
    res.notes.append(
        "ours is the batch memory allows (a queue always waits); the paper's is at a fixed rate "
        "(ShareGPT 2 req/s, Alpaca 30 req/s), where its paged system is not always memory-bound"
    )
    real = res.data["sharegpt-real"]["trace"]
    res.notes.append(f"real ShareGPT: mean prompt {real['prompt']:.1f} / output {real['output']:.1f}; {REAL_NOTE}")
    return res
