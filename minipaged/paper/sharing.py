"""Fig. 15: memory saved by sharing blocks, parallel sampling and beam search (measured on the engine).

``n`` samples of one prompt share the prompt's blocks (``ref_cnt`` > 1) and copy a shared block
only when one of them writes into it (copy-on-write). Beam search shares more: the beams of one
request descend from each other, so they share their common history too, and a beam that is
dropped frees its blocks while the survivors fork. The paper measures, on Alpaca, the blocks
saved by sharing as a share of the blocks the same sequences would hold without it: 6.09 /
8.53 / 9.79% for n = 2 / 4 / 6 samples and 37.56 / 53.13 / 55.16% for beam width 2 / 4 / 6.

Here the engine's own figures say it after every step (:class:`~minipaged.paper.engines.StepRecorder`):
``blocks_saved`` (sum of ``ref_cnt - 1`` over shared blocks) against the blocks in use, summed
over the steps: ``saved / (in use + saved)``.

:func:`v0_vs_v1` measures what the paper's in-engine sharing costs against vLLM V1's way
(docs/concepts.md): ``n`` samples as ``n`` requests sharing through the prefix cache, and beam
search as a loop outside the engine that resubmits every beam at every step.
"""

from __future__ import annotations

import time
from typing import Any

from tqdm.auto import tqdm

from minipaged.engine.llm import LLM
from minipaged.engine.sampling_params import BeamSearchParams, SamplingParams
from minipaged.paper.engines import BUDGET, MODEL, StepRecorder, vocab_size
from minipaged.paper.report import PaperResult
from minipaged.paper.serving import alpaca_requests
from minipaged.utils import cdiv

PAPER = {
    "parallel": {2: 6.09, 4: 8.53, 6: 9.79},
    "beam": {2: 37.56, 4: 53.13, 6: 55.16},
}
WIDTHS = (2, 4, 6)


def _sampled(seed: int, max_tokens: int, n: int = 1) -> SamplingParams:
    """Random sampling (temperature 1) with its own seed, exactly ``max_tokens`` tokens per sample."""
    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True)


def saved_share(stats: list[dict]) -> float:
    """Blocks saved by sharing over the blocks needed without it, summed over the recorded steps."""
    saved = sum(s["blocks_saved"] for s in stats)
    used = sum(s["slots_allocated"] // s["block_size"] for s in stats)
    return saved / max(used + saved, 1)


def _engine(model: str | None, prompts: list[list[int]], width: int, max_tokens: int, **kw: Any) -> LLM:
    """A paged engine with room for every sequence at once (no preemption: it would change what is shared)."""
    bs = BUDGET["block_size"]
    blocks = len(prompts) * width * (cdiv(max(map(len, prompts)) + max_tokens, bs) + 1)
    return LLM(model, block_size=bs, num_kvcache_blocks=blocks, max_num_seqs=len(prompts) * width, **kw)


def parallel_sampling(model: str | None, prompts: list[list[int]], n: int, max_tokens: int) -> float:
    """Memory saved (a fraction) when each prompt runs ``SamplingParams(n=n)``, ``max_tokens`` per sample."""
    llm = _engine(model, prompts, n, max_tokens, max_model_len=BUDGET["max_model_len"])
    params = [_sampled(i, max_tokens, n) for i in range(len(prompts))]
    with StepRecorder(llm) as rec:
        llm.generate(prompts, params, use_tqdm=False)
    return saved_share(rec.stats)


def beam_search(model: str | None, prompts: list[list[int]], width: int, max_tokens: int) -> float:
    """Memory saved (a fraction) by the engine's beam search of ``width`` beams, ``max_tokens`` per beam."""
    llm = _engine(model, prompts, width, max_tokens, max_model_len=BUDGET["max_model_len"])
    with StepRecorder(llm) as rec:
        llm.beam_search(prompts, BeamSearchParams(beam_width=width, max_tokens=max_tokens))
    return saved_share(rec.stats)


def memory_saved(
    num_requests: int = 8,
    widths: tuple[int, ...] = WIDTHS,
    max_tokens: int | None = None,
    model: str | None = MODEL,
    quick: bool = False,
) -> PaperResult:
    """Fig. 15 on Alpaca-shaped prompts; every sample and beam generates ``max_tokens`` tokens (the
    trace's mean output length when None: one beam search call has one length)."""
    res = PaperResult("fig15", "Fig. 15: memory saved by sharing (Alpaca-shaped)", "measured", quick=quick)
    requests = alpaca_requests(num_requests, vocab_size(model), 0)
    prompts = [p for p, _ in requests]
    max_tokens = max_tokens or round(sum(n for _, n in requests) / len(requests))
    res.settings = {
        "model": model,
        "requests": num_requests,
        "max_tokens": max_tokens,
        "block_size": BUDGET["block_size"],
    }
    res.data = {"parallel": {}, "beam": {}}
    for n in tqdm(widths, desc="fig15 parallel sampling", leave=False):
        res.data["parallel"][str(n)] = 100 * parallel_sampling(model, prompts, n, max_tokens)
    for w in tqdm(widths, desc="fig15 beam search", leave=False):
        res.data["beam"][str(w)] = 100 * beam_search(model, prompts, w, max_tokens)
    for kind, label in (("parallel", "parallel sampling n"), ("beam", "beam width")):
        for w, value in res.data[kind].items():
            res.add(f"{label} = {w}: memory saved", value, PAPER[kind].get(int(w)), "%")
    res.data["v0_vs_v1"] = v0_vs_v1(model, prompts, 4, max_tokens)
    v = res.data["v0_vs_v1"]
    res.add(
        "n = 4, V1 (4 requests + prefix cache) / V0 (CoW): mean blocks", v["v1"]["mean_blocks"] / v["v0"]["mean_blocks"]
    )
    res.add("n = 4, V1 / V0: prefill tokens computed", v["v1"]["prefill_tokens"] / v["v0"]["prefill_tokens"])
    res.add("beam 4 outside the engine: prefill tokens per output token", v["beam_outside"]["prefill_per_token"])
    return res


def _blocks(stats: list[dict]) -> dict:
    used = [s["slots_allocated"] // s["block_size"] for s in stats]
    return {"mean_blocks": sum(used) / len(used), "peak_blocks": max(used)}


def v0_vs_v1(model: str | None, prompts: list[list[int]], n: int, max_tokens: int) -> dict:
    """``n`` samples per prompt two ways, and beam search outside the engine.

    - ``v0``: one request with ``SamplingParams(n=n)``: the samples fork and share blocks (copy-on-write);
    - ``v1``: ``n`` requests per prompt with prefix caching on: they share the prompt's full
      blocks through the cache; each computes the prompt's last, partial block itself;
    - ``beam_outside``: ``n`` beams per prompt, each extended one token at a time by a new request
      carrying its whole sequence (prefix caching on): what every step recomputes. The beams here
      keep their own lines (no reranking): the recomputed tokens do not depend on which survive.
    """
    out = {}
    for key, caching in (("v0", False), ("v1", True)):
        llm = _engine(model, prompts, n, max_tokens, enable_prefix_caching=caching)
        if key == "v0":
            work, params = prompts, [_sampled(i, max_tokens, n) for i in range(len(prompts))]
        else:
            work = [p for p in prompts for _ in range(n)]
            params = [_sampled(i, max_tokens) for i in range(len(work))]
        start = time.perf_counter()
        with StepRecorder(llm) as rec:
            llm.generate(work, params, use_tqdm=False)
        seconds = time.perf_counter() - start  # kv_stats() after each step included: the same cost in both
        out[key] = {
            **_blocks(rec.stats),
            "prefill_tokens": llm.kv_stats()["prefill_tokens_computed"],
            "seconds": seconds,
        }
    llm = _engine(model, prompts, n, max_tokens, enable_prefix_caching=True)
    beams = [list(p) for p in prompts for _ in range(n)]
    start = time.perf_counter()
    for step in range(max_tokens):
        params = [_sampled(step * len(beams) + i, 1) for i in range(len(beams))]
        outs = llm.generate(beams, params, use_tqdm=False)
        beams = [b + o.outputs[0].token_ids for b, o in zip(beams, outs)]
    prefill = llm.kv_stats()["prefill_tokens_computed"]
    out["beam_outside"] = {
        "prefill_tokens": prefill,
        "prompt_tokens": sum(map(len, prompts)),
        "prefill_per_token": prefill / (len(beams) * max_tokens),
        "seconds": time.perf_counter() - start,
    }
    return out
