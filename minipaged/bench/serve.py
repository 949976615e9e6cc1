"""Benchmark: the server under load, measured the way vLLM's serving benchmark measures it.

``python -m minipaged bench serve --help`` lists the flags. Requests arrive as a Poisson process at
``--request-rate`` per second (``inf``: all at once), at most ``--max-concurrency`` in flight,
each a real HTTP request streamed over server-sent events. Printed per server, as vLLM's
``benchmark_serving`` prints them: request throughput, output tokens/s, and TTFT (time to first
token), TPOT (time per output token after the first) and ITL (the gaps between streamed chunks):
mean, median (p50) and p99; and each request's output tokens over its time, what one client sees.

With ``--base-url`` the bench drives a server that is already running (minipaged's, or vLLM's:
the requests are plain OpenAI completions). Without it, the bench starts one minipaged server
per ``--kv-layout`` on this machine with the same KV budget and engine settings, so paged and
contiguous are compared side by side. ``--compare-offline`` also runs ``LLM.generate`` on the
same requests in this process and prints the server's tokens/s as a share of it (the server's
overhead) and whether the texts are identical. ``--watch-projector`` counts projector frames.

Two datasets, greedy. ``--dataset copy`` (the default): the embedded model's copy task (a shared
preamble of ``--preamble-chars``, then a random text), ``--max-tokens`` each. ``--dataset
sharegpt``: real ShareGPT conversations sampled as vLLM's serving benchmark samples them
(:mod:`minipaged.paper.sharegpt`: the first turn's text is the prompt, the second turn's length in
the real model's tokens is ``max_tokens``; seeded by ``--seed``), and the servers the bench starts
load the real chat model. Timings are this machine's, under whatever else runs on it."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
import threading
import time
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minipaged.bench import parser
from minipaged.paper import sharegpt
from minipaged.tiny import task


@dataclass
class Result:
    """One request as the client saw it."""

    ok: bool = False
    error: str = ""
    text: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)


Work = list[tuple[str, int]]  # (prompt text, max_tokens) per request


def workload(args: Namespace) -> Work:
    """The requests ``args.dataset`` asks for: copy prompts, or ShareGPT sampled as vLLM samples it."""
    if args.dataset == "sharegpt":
        requests = sharegpt.sample_requests(args.num_prompts, args.seed, output_len=args.sharegpt_output_len)
        return [(r.prompt, r.output_len) for r in requests]
    rng = random.Random(args.seed)
    preamble = task.random_preamble(rng, args.preamble_chars, args.preamble_chars)
    texts = [task.random_text(rng, 4, task.MAX_TEXT_CHARS) for _ in range(args.num_prompts)]
    return [(task.prompt_for(text, preamble), args.max_tokens) for text in texts]


async def one_request(client: Any, url: str, body: dict, headers: dict) -> Result:
    """POST one streamed completion; time its chunks."""
    res = Result()
    start = last = time.perf_counter()
    first = True
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                payload = json.loads(await response.aread() or b"{}")
                res.error = f"HTTP {response.status_code}: {payload.get('error', {}).get('message', '')}"
                return res
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = chunk["error"]["message"]
                    return res
                if chunk.get("usage"):
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                # as vLLM's benchmark times them: every chunk that carries a choice is a token step
                now = time.perf_counter()
                if first:
                    res.ttft, first = now - start, False
                else:
                    res.itl.append(now - last)
                last = now
                res.text += "".join(c.get("text", "") for c in chunk["choices"])
    except Exception as e:  # a connection refused or dropped counts as a failed request, not a crash
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.latency = last - start  # to the last token's chunk
    res.ok = not first
    res.error = "" if res.ok else "no chunk with a token came back"
    return res


async def run_load(
    base_url: str,
    model: str,
    prompts: Work,
    args: Namespace,
    headers: dict,
    watch: bool,
) -> tuple[list[Result], float, tuple[int, int] | None]:
    """Send every prompt; returns the results, the duration and (frames, distinct steps) seen if ``watch``."""
    import httpx

    rng = np.random.default_rng(args.seed)
    limit = args.max_concurrency or len(prompts)
    gate = asyncio.Semaphore(limit)
    timeout = httpx.Timeout(args.timeout, connect=30)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=limit + 2)) as client:
        seen: list[int] = []
        watcher = asyncio.ensure_future(_watch(client, base_url, headers, seen)) if watch else None

        async def limited(prompt: str, max_tokens: int) -> Result:
            body = dict(
                model=model,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=0.0,
                ignore_eos=args.ignore_eos,
                stream=True,
                stream_options={"include_usage": True},
            )
            async with gate:
                return await one_request(client, f"{base_url}/v1/completions", body, headers)

        start = time.perf_counter()
        tasks = []
        for prompt, max_tokens in prompts:
            tasks.append(asyncio.ensure_future(limited(prompt, max_tokens)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        frames = None
        if watcher is not None:
            watcher.cancel()
            frames = (len(seen), len(set(seen)))
    return results, duration, frames


async def _watch(client: Any, base_url: str, headers: dict, seen: list[int]) -> None:
    """Record the engine step of every projector frame pushed."""
    async with client.stream("GET", f"{base_url}/projector/stream", headers=headers, timeout=None) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[len("data: ") :])["step"])


def summary(results: list[Result], duration: float) -> dict[str, object]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ms = lambda xs: np.asarray(xs, dtype=float) * 1000  # noqa: E731
    ttft = ms([r.ttft for r in ok])
    tpot = ms([(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1])
    itl = ms([gap for r in ok for gap in r.itl])
    figures: dict[str, object] = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration": duration,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_throughput": (in_tokens + out_tokens) / duration,
        "per_request_throughput": float(np.mean([r.output_tokens / r.latency for r in ok] or [float("nan")])),
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        for stat, f in (("mean", np.mean), ("median", np.median), ("p99", lambda a: np.percentile(a, 99))):
            figures[f"{stat}_{name}_ms"] = float(f(xs)) if len(xs) else float("nan")
    errors = [r.error for r in results if not r.ok]
    figures["first_error"] = errors[0] if errors else ""
    return figures


def print_summary(title: str, f: dict) -> None:
    width = 50
    print(f"{' Serving Benchmark Result: ' + title + ' ':=^{width}}")
    rows = [
        ("Successful requests:", f"{f['completed']}"),
        ("Failed requests:", f"{f['failed']}"),
        ("Benchmark duration (s):", f"{f['duration']:.2f}"),
        ("Total input tokens:", f"{f['input_tokens']}"),
        ("Total generated tokens:", f"{f['output_tokens']}"),
        ("Request throughput (req/s):", f"{f['request_throughput']:.2f}"),
        ("Output token throughput (tok/s):", f"{f['output_throughput']:.2f}"),
        ("Total token throughput (tok/s):", f"{f['total_throughput']:.2f}"),
        ("Output tok/s per request (mean):", f"{f['per_request_throughput']:.2f}"),
    ]
    for label, value in rows:
        print(f"{label:<40}{value:>10}")
    for name, heading in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st token)"),
        ("itl", "Inter-token Latency"),
    ):
        print(f"{heading:-^{width}}")
        for stat, shown in (("mean", "Mean"), ("median", "Median"), ("p99", "P99")):
            print(f"{shown + ' ' + name.upper() + ' (ms):':<40}{f[f'{stat}_{name}_ms']:>10.2f}")
    if f["first_error"]:
        print(f"first error: {f['first_error']}")
    print("=" * width)


# -- servers started by the bench --------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_args(args: Namespace, layout: str) -> dict:
    kwargs = dict(
        kv_layout=layout,
        num_kvcache_blocks=args.num_kvcache_blocks,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
    )
    if layout == "paged":  # said either way: the server's own default is on
        kwargs["enable_prefix_caching"] = bool(args.enable_prefix_caching)
    return kwargs


class LocalServer:
    """``python -m minipaged serve`` (``model``, else ``--copy-model``) on a free loopback port, for a ``with``."""

    def __init__(self, kwargs: dict, num_prompts: int, model: str | None = None, start_timeout: float = 180) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        which = [model] if model else ["--copy-model"]
        cmd = [sys.executable, "-m", "minipaged", "serve", *which, "--port", str(self.port)]
        for k, v in kwargs.items():
            flag = k.replace("_", "-")
            cmd += [f"--{flag}"] if v is True else [f"--no-{flag}"] if v is False else [f"--{flag}", str(v)]
        cmd += ["--max-queued-requests", str(num_prompts), "--max-tokens-cap", "100000"]
        self.cmd, self.start_timeout = cmd, start_timeout

    def __enter__(self) -> LocalServer:
        import httpx

        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {self.proc.communicate()[1][-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"the server did not answer within {self.start_timeout} s")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def offline(kwargs: dict, prompts: Work, args: Namespace, model: str | None = None) -> tuple[float, list[str], int]:
    """LLM.generate on the same requests: (output tokens/s, texts, output tokens).

    It runs on a thread of its own, as the server's engine does, so that both use torch the same
    way: on a busy CPU, torch's thread pool behaves very differently when called from the main
    thread (measured here: the same steps 7x slower on 2 cores shared with other work), and the
    comparison is meant to show the server's own cost, not that.
    """
    from minipaged.engine.llm import LLM
    from minipaged.engine.sampling_params import SamplingParams

    llm = LLM(model, **kwargs)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=args.ignore_eos) for _, n in prompts]
    done: dict = {}

    def work() -> None:
        start = time.perf_counter()
        try:
            done["outs"] = llm.generate([p for p, _ in prompts], params, use_tqdm=False)
        except Exception as e:  # raised again below, on the caller's thread
            done["error"] = e
        done["duration"] = time.perf_counter() - start

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    if "error" in done:
        raise done["error"]
    outs = done["outs"]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens / done["duration"], [o.outputs[0].text for o in outs], tokens


def main(argv: list[str] | None = None) -> None:
    p = parser("serve", __doc__)
    p.add_argument("--base-url", help="a running server (e.g. http://127.0.0.1:8000); default: start minipaged's")
    p.add_argument("--model", help="the model name to send (default: what GET /v1/models lists)")
    p.add_argument("--join-code", help="the server's join code, if it has one")
    p.add_argument("--dataset", choices=("copy", "sharegpt"), default="copy", help="the prompts (default: copy)")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--sharegpt-output-len", type=int, help="sharegpt: every request's max_tokens (default: its own)")
    p.add_argument("--request-rate", "--rate", type=float, default=float("inf"), help="requests/s, or inf")
    p.add_argument("--max-concurrency", type=int, default=64, help="requests in flight at most (0: no limit)")
    p.add_argument("--max-tokens", type=int, default=task.MAX_TEXT_CHARS + 1, help="copy: each request's max_tokens")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--preamble-chars", type=int, default=160, help="copy: the shared preamble's length")
    p.add_argument("--seed", type=int, default=0, help="the copy texts' seed, or ShareGPT's shuffle")
    p.add_argument("--timeout", type=float, default=600, help="seconds one request may take")
    p.add_argument("--watch-projector", action="store_true", help="count the projector frames pushed meanwhile")
    p.add_argument("--compare-offline", action="store_true", help="also run LLM.generate on the same requests")
    g = p.add_argument_group("servers started by the bench (without --base-url)")
    g.add_argument(
        "--serve-model",
        help=f"the model they load (default: the embedded model; with --dataset sharegpt {sharegpt.REAL_MODEL})",
    )
    g.add_argument("--kv-layout", default="paged", help="paged, contiguous, or both: paged,contiguous")
    g.add_argument("--num-kvcache-blocks", type=int, default=512)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-model-len", type=int, help="default: 320 (copy), 2048 (sharegpt)")
    g.add_argument("--enable-prefix-caching", action="store_true")
    args = p.parse_args(argv)
    if args.max_model_len is None:
        args.max_model_len = sharegpt.MAX_TOTAL_LEN if args.dataset == "sharegpt" else 320
    model = args.serve_model or (str(sharegpt.REAL_MODEL) if args.dataset == "sharegpt" else None)
    prompts = workload(args)
    headers = {"Authorization": f"Bearer {args.join_code}"} if args.join_code else {}
    max_tokens = sum(n for _, n in prompts) / len(prompts)
    print(
        f"{len(prompts)} {args.dataset} requests, rate {args.request_rate}/s, at most {args.max_concurrency or 'all'} "
        f"at once, mean max_tokens {max_tokens:.1f}{' (ignore_eos)' if args.ignore_eos else ''}"
    )
    if args.base_url:
        rows = {"server": _bench(args.base_url.rstrip("/"), prompts, args, headers)}
    else:
        rows = {}
        for layout in args.kv_layout.split(","):
            kwargs = engine_args(args, layout)
            with LocalServer(kwargs, len(prompts), model) as server:
                rows[layout] = _bench(server.url, prompts, args, headers, title=layout)
            if args.compare_offline:
                _compare_offline(kwargs, prompts, args, rows[layout], model)
    if len(rows) > 1:
        (a, fa), (b, fb) = list(rows.items())[:2]
        print(
            f"{a} / {b}: output tokens/s x{fa['output_throughput'] / fb['output_throughput']:.2f}, "
            f"mean TTFT x{fa['mean_ttft_ms'] / fb['mean_ttft_ms']:.2f}"
        )


def _bench(base_url: str, prompts: Work, args: Namespace, headers: dict, title: str = "server") -> dict:
    import httpx

    model = args.model or httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
    results, duration, frames = asyncio.run(run_load(base_url, model, prompts, args, headers, args.watch_projector))
    figures = summary(results, duration)
    figures["texts"] = [r.text for r in results]
    print_summary(title, figures)
    if frames is not None:
        print(
            f"projector: {frames[0] / duration:.1f} frames/s pushed during the run "
            f"({frames[1] / duration:.1f}/s showing a new engine step)"
        )
    return figures


def _compare_offline(kwargs: dict, prompts: Work, args: Namespace, served: dict, model: str | None) -> None:
    rate, texts, tokens = offline(kwargs, prompts, args, model)
    same = sum(a == b for a, b in zip(texts, served["texts"]))
    print(
        f"LLM.generate on the same {len(prompts)} requests: {rate:.2f} output tokens/s ({tokens} tokens); "
        f"through the server {served['output_throughput']:.2f}: {100 * served['output_throughput'] / rate:.0f}% "
        f"of it; texts identical {same}/{len(prompts)}"
    )
