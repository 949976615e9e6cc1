"""Fig. 16 / §6.4: requests that share a prefix, paged with prefix caching against Orca (measured).

The paper translates with a few-shot prompt in front of every request: a one-shot prefix of 80
tokens and a five-shot prefix of 341. Paged memory stores that prefix once and every request
points at its blocks; Orca (Oracle) reserves the prefix again inside every request's buffer and
prefills it again. vLLM sustains 1.67x (80 tokens) and 3.58x (341 tokens) Orca (Oracle)'s rate.

Here: Alpaca-shaped requests behind one shared prefix of 80 or 341 tokens, every request queued
at once on the same KV budget, the rate each serves them while some still wait (the highest rate
it sustains: see Fig. 12), paged with prefix caching against Orca (Oracle), and Orca (Max).
"""

from __future__ import annotations

from tqdm.auto import tqdm

from minipaged.paper.engines import BUDGET, MODEL, make_llm, saturated_rate, vocab_size, warm_up
from minipaged.paper.report import PaperResult
from minipaged.paper.workloads import ALPACA, SYSTEM_LABELS, engine_requests, paper_trace

PAPER = {80: 1.67, 341: 3.58}  # paged / Orca (Oracle), sustained request rate
BASELINES = ("orca-oracle", "orca-max")


def prefix_throughput(
    prefix_lens: tuple[int, ...] = (80, 341),
    num_requests: int = 48,  # more than paged memory holds with the prefix shared: a queue waits
    window: int = 8,
    max_output: int | None = None,
    model: str | None = MODEL,
    quick: bool = False,
) -> PaperResult:
    res = PaperResult("fig16", "Fig. 16: a shared prefix, paged + prefix caching against Orca", "measured", quick=quick)
    res.settings = {"model": model, **BUDGET, "requests": num_requests, "window": window, "max_output": max_output}
    vocab = vocab_size(model)
    for prefix_len in tqdm(prefix_lens, desc="fig16", leave=False):
        trace = paper_trace(
            ALPACA, num_requests, 0, max_len=BUDGET["max_model_len"], shared_prefix_len=prefix_len, num_prefixes=1
        )
        requests = [(ids, min(n, max_output or n)) for ids, n in engine_requests(trace, vocab)]
        rates, tokens = {}, {}
        for system in ("paged", *BASELINES):
            kw = {"enable_prefix_caching": True} if system == "paged" else {}
            llm = make_llm(system, model, **BUDGET, **kw)
            warm_up(llm)
            full = saturated_rate(llm, requests, window)
            rates[system], tokens[system] = full["rate"], full["finished"]
            if system == "paged":
                res.data.setdefault("prefill_tokens", {})[str(prefix_len)] = llm.kv_stats()["prefill_tokens_computed"]
        res.data.setdefault("requests_per_s", {})[str(prefix_len)] = rates
        for system in BASELINES:
            if system in rates:
                paper = PAPER.get(prefix_len) if system == "orca-oracle" else None
                label = f"{prefix_len}-token prefix: paged / {SYSTEM_LABELS[system]}"
                res.add(label, rates["paged"] / rates[system], paper, "x")
        both = [set(t).intersection(tokens["paged"]) for t in tokens.values()]
        same = all(t[i] == tokens["paged"][i] for t, common in zip(tokens.values(), both) for i in common)
        res.notes.append(
            f"{prefix_len}-token prefix: the requests that finished under more than one system generated "
            f"the same tokens: {same}"
        )
    return res
