"""Benchmark: the Triton paged-attention kernels against the torch reference and against
``torch.nn.functional.scaled_dot_product_attention`` on an equivalent contiguous cache.

``python -m minipaged bench kernels [--quick] [--device cuda] [--peak-gbps 4800]``

Each row is one implementation on one shape: time per call, achieved bandwidth (bytes of K/V
read plus q and out, over the time: the traffic any implementation must move) and, on CUDA,
that bandwidth as a fraction of the device's peak. Decode is memory-bound, so its fraction of
peak is the figure of merit; prefill does more arithmetic per byte.

On CUDA the timings come from ``triton.testing.do_bench``. On CPU the Triton kernels run in
Triton's interpreter: the figures are interpreter timings (NumPy emulation), not kernel speed,
and the shapes are small.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from minipaged.attention import batched, reference
from minipaged.bench import parser
from minipaged.utils import cdiv

# Peak memory bandwidth in GB/s, matched by substring of torch.cuda.get_device_name() (first hit).
PEAK_GBPS = {
    "GH200": 4000.0,  # before "H200", which it contains
    "H200": 4800.0,
    "H100 PCIe": 2000.0,
    "H100 NVL": 3900.0,
    "H100": 3350.0,
    "B200": 8000.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "A100": 1555.0,
    "L40S": 864.0,
    "L4": 300.0,
    "A10G": 600.0,
    "A10": 600.0,
    "RTX 4090": 1008.0,
    "RTX 3090": 936.0,
    "T4": 320.0,
    "V100": 900.0,
}

# (op, num_seqs, q_len, context_len, num_heads, num_kv_heads, head_dim, block_size)
CUDA_SHAPES = [
    ("decode", 64, 1, 1024, 32, 8, 128, 16),
    ("decode", 8, 1, 8192, 32, 8, 128, 16),
    ("decode", 256, 1, 512, 16, 16, 64, 16),
    ("prefill", 4, 1024, 1024, 32, 8, 128, 16),
    ("prefill", 16, 256, 256, 16, 16, 64, 16),
]
CUDA_QUICK = [CUDA_SHAPES[0], CUDA_SHAPES[3]]
CPU_SHAPES = [
    ("decode", 4, 1, 256, 8, 2, 64, 16),
    ("decode", 2, 1, 1024, 8, 2, 64, 16),
    ("prefill", 2, 64, 64, 8, 2, 64, 16),
]
CPU_QUICK = [("decode", 2, 1, 64, 4, 2, 64, 16), ("prefill", 1, 16, 16, 4, 2, 64, 16)]


def peak_gbps_for(name: str) -> float | None:
    for key, value in PEAK_GBPS.items():
        if key.lower() in name.lower():
            return value
    return None


def _make_case(
    op: str,
    num_seqs: int,
    q_len: int,
    ctx: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
    seed: int = 0,
) -> tuple[torch.Tensor, ...]:
    """A paged cache with each sequence's blocks scattered over the pool, the same K/V laid out
    contiguously ([num_seqs, num_kv_heads, ctx, head_dim]) for SDPA, and the queries."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = cdiv(ctx, block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    v_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, generator=gen).int().reshape(num_seqs, blocks_per_seq).to(device)
    ctx_lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=device)
    cu = torch.arange(num_seqs + 1, dtype=torch.int32, device=device) * q_len
    q = torch.randn(num_seqs * q_len, num_heads, head_dim, generator=gen).to(dtype=dtype, device=device)

    def contiguous(cache: torch.Tensor) -> torch.Tensor:
        seqs = cache[tables.long()].reshape(num_seqs, blocks_per_seq * block_size, num_kv_heads, head_dim)
        return seqs[:, :ctx].transpose(1, 2).contiguous()

    return q, k_cache, v_cache, tables, cu, ctx_lens, contiguous(k_cache), contiguous(v_cache)


def _sdpa_fn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_seqs: int, q_len: int, causal: bool
) -> Callable[[], torch.Tensor]:
    """SDPA over [num_seqs, heads, len, head_dim]; GQA through enable_gqa where torch has it."""
    qs = q.reshape(num_seqs, q_len, q.shape[1], q.shape[2]).transpose(1, 2)
    group = q.shape[1] // k.shape[1]
    try:
        F.scaled_dot_product_attention(qs[:1, :, :1], k[:1, :, :1], v[:1, :, :1], enable_gqa=True)
        return lambda: F.scaled_dot_product_attention(qs, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:  # torch < 2.5: expand the KV heads once, outside the timing
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return lambda: F.scaled_dot_product_attention(qs, k, v, is_causal=causal)


def _time_ms(fn: Callable[[], object], device: str, iters: int) -> float:
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100 if iters > 1 else 25, return_mode="median"))
    fn()  # warm-up (the interpreter's first call traces and caches)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def run(device: str | None = None, quick: bool = False, peak_gbps: float | None = None) -> list[dict]:
    """Time every implementation on every shape; print a table; return one dict per row."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = torch.device(device).type == "cuda"
    import minipaged.kernels as kernels  # imports Triton (and picks the interpreter off CUDA)

    if on_cuda:
        shapes, dtype, iters = (CUDA_QUICK if quick else CUDA_SHAPES), torch.bfloat16, (1 if quick else 10)
        name = torch.cuda.get_device_name(torch.device(device))
        peak_gbps = peak_gbps or peak_gbps_for(name)
        print(f"device: {name}; peak bandwidth: {f'{peak_gbps:.0f} GB/s' if peak_gbps else 'unknown (--peak-gbps)'}")
        if kernels.interpreting(device):
            print("note: TRITON_INTERPRET is set, the Triton rows are interpreter timings")
    else:
        shapes, dtype, iters = (CPU_QUICK if quick else CPU_SHAPES), torch.float32, (1 if quick else 3)
        peak_gbps = None
        print("device: CPU. The Triton rows are Triton *interpreter* timings (NumPy emulation of the")
        print("kernel), not kernel speed; only the GPU figures say anything about the kernels.")

    rows = []
    for op, num_seqs, q_len, ctx, num_heads, num_kv_heads, head_dim, block_size in shapes:
        q, k_cache, v_cache, tables, cu, ctx_lens, k_contig, v_contig = _make_case(
            op, num_seqs, q_len, ctx, num_heads, num_kv_heads, head_dim, block_size, dtype, device
        )
        if op == "decode":
            triton_fn = partial(kernels.paged_decode_attention, q, k_cache, v_cache, tables, ctx_lens)
            ref_fn = partial(reference.paged_decode_attention, q, k_cache, v_cache, tables, ctx_lens)
            batched_fn = partial(batched.paged_decode_attention, q, k_cache, v_cache, tables, ctx_lens)
        else:
            args = (q, k_cache, v_cache, tables, cu, ctx_lens)
            triton_fn = partial(kernels.paged_prefill_attention, *args, max_q_len=q_len)
            ref_fn = partial(reference.paged_prefill_attention, *args)
            batched_fn = partial(batched.paged_prefill_attention, *args)
        # prefill shapes have q_len == context_len, so SDPA's top-left causal mask is the right one
        sdpa_fn = _sdpa_fn(q, k_contig, v_contig, num_seqs, q_len, causal=op == "prefill")
        err = (triton_fn().float() - ref_fn().float()).abs().max().item()

        elem = q.element_size()
        nbytes = 2 * num_seqs * ctx * num_kv_heads * head_dim * elem + 2 * q.numel() * elem
        shape = f"{num_seqs}x(q{q_len},ctx{ctx}) h{num_heads}/{num_kv_heads} d{head_dim} bs{block_size}"
        impls = (("triton", triton_fn), ("torch-batched", batched_fn), ("torch-ref", ref_fn), ("sdpa-contig", sdpa_fn))
        for impl, fn in impls:
            ms = _time_ms(fn, "cuda" if on_cuda else "cpu", iters)
            gbps = nbytes / (ms * 1e-3) / 1e9
            rows.append(
                dict(
                    op=op, impl=impl, shape=shape, num_seqs=num_seqs, q_len=q_len, context_len=ctx,
                    num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
                    dtype=str(dtype).removeprefix("torch."), device=device,
                    interpreted=impl == "triton" and kernels.interpreting(device),
                    ms=ms, bytes=nbytes, gbps=gbps, peak_fraction=(gbps / peak_gbps) if peak_gbps else None,
                    max_abs_err=err if impl == "triton" else None,
                )
            )  # fmt: skip
    _print_table(rows)
    return rows


def _print_table(rows: list[dict]) -> None:
    head = f"{'op':8s} {'shape':44s} {'impl':17s} {'ms/call':>10s} {'GB/s':>9s} {'of peak':>8s} {'max|err|':>9s}"
    print(head)
    print("-" * len(head))
    for r in rows:
        peak = f"{100 * r['peak_fraction']:7.1f}%" if r["peak_fraction"] is not None else f"{'-':>8s}"
        err = f"{r['max_abs_err']:9.1e}" if r["max_abs_err"] is not None else f"{'':9s}"
        impl = r["impl"] + (" (interp)" if r["interpreted"] else "")
        print(f"{r['op']:8s} {r['shape']:44s} {impl:17s} {r['ms']:10.3f} {r['gbps']:9.4g} {peak} {err}")


def main(argv: list[str] | None = None) -> list[dict]:
    p = parser("kernels", __doc__)
    p.add_argument("--quick", action="store_true", help="fewer, smaller shapes and iterations")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--peak-gbps", type=float, default=None, help="peak memory bandwidth, GB/s (default: by GPU name)")
    args = p.parse_args(argv)
    return run(device=args.device, quick=args.quick, peak_gbps=args.peak_gbps)


if __name__ == "__main__":
    main()
