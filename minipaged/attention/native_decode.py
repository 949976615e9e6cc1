"""Decode attention that reads the KV blocks where they lie: a small C kernel, compiled at first use.

A decode step gives every running sequence one new query token, and each must read its whole
context once. In plain torch that cannot be done in place: a tensor op needs the context laid
out in one piece, so :mod:`minipaged.attention.batched` first gathers every sequence's blocks
into a new tensor, then multiplies. At 32 rows and 400-token contexts that gather writes as many
bytes as the products then read, every layer of every step.

Here one C function does what vLLM's paged-attention kernels do, on the CPU: for each sequence
it walks the block table, and for each block reads the keys in the cache itself,
``k_cache[block, t, kv_head, :]``, scores them against the query heads that share that KV head
(grouped-query attention), and folds them into a running softmax:

    m' = max(m, max_t s_t)          the running maximum of the scores
    l' = l * exp(m - m') + sum_t exp(s_t - m')
    acc' = acc * exp(m - m') + sum_t exp(s_t - m') v_t

and the output is ``acc / l`` after the last block (the online softmax of FlashAttention, as
the Triton kernel of stage 4 computes it). Scores, softmax and sums are fp32; a bf16 cache is
widened to fp32 as it is read (a bf16 number is the top half of an fp32 one). K and V are read
once, nothing else is written. Sequences are shared among threads with OpenMP. Two versions of
the same loop: plain C for any shape, and AVX-512 for ``head_dim == 64`` where the CPU has it.

Shapes: ``q, out: [num_seqs, num_heads, head_dim]`` fp32 contiguous; ``k_cache, v_cache:
[num_blocks, block_size, num_kv_heads, head_dim]`` (one layer, fp32 or bf16, contiguous);
``block_tables: int32 [num_seqs, max_blocks]``; ``context_lens: int32 [num_seqs]``.

The source is compiled once per machine with the system's C compiler (``cc``, or ``$CC``) into
``~/.cache/minipaged/native/`` and loaded with :mod:`ctypes`; no compiler, or a build that fails,
and :func:`load` says so once and returns None: the caller keeps the plain-torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float widen_bf16(uint16_t h) {
    union { uint32_t u; float f; } x;
    x.u = (uint32_t)h << 16;
    return x.f;
}

#define MAX_GROUP 16
#define MAX_DIM 256
#define MAX_BLOCK 256
#define MAX_HEADS 64

/* One (sequence, KV head) pair: its `group` query heads over its context, block by block. */
static void attend_pair(const float *q, const void *k_cache, const void *v_cache, int bf16,
                        const int32_t *table, int context_len, float *out, int group, int kv_head,
                        int num_kv_heads, int head_dim, int block_size, float scale) {
    float m[MAX_GROUP], l[MAX_GROUP], acc[MAX_GROUP][MAX_DIM], s[MAX_GROUP][MAX_BLOCK];
    float kf[MAX_DIM];
    for (int g = 0; g < group; g++) {
        m[g] = -3.0e38f;
        l[g] = 0.f;
        memset(acc[g], 0, sizeof(float) * head_dim);
    }
    const long token_stride = (long)num_kv_heads * head_dim;
    for (int start = 0; start < context_len; start += block_size) {
        const int n = context_len - start < block_size ? context_len - start : block_size;
        const long base = ((long)table[start / block_size] * block_size) * token_stride + (long)kv_head * head_dim;
        for (int t = 0; t < n; t++) {           /* scores of this block's keys */
            const long at = base + t * token_stride;
            if (bf16) {
                const uint16_t *k = (const uint16_t *)k_cache + at;
                for (int d = 0; d < head_dim; d++) kf[d] = widen_bf16(k[d]);
            } else {
                memcpy(kf, (const float *)k_cache + at, sizeof(float) * head_dim);
            }
            for (int g = 0; g < group; g++) {
                const float *qg = q + (long)g * head_dim;
                float dot = 0.f;
                for (int d = 0; d < head_dim; d++) dot += qg[d] * kf[d];
                s[g][t] = dot * scale;
            }
        }
        for (int g = 0; g < group; g++) {       /* fold the block into the running softmax */
            float mb = m[g];
            for (int t = 0; t < n; t++) mb = s[g][t] > mb ? s[g][t] : mb;
            const float shrink = start == 0 ? 0.f : expf(m[g] - mb);  /* nothing to shrink yet */
            l[g] *= shrink;
            for (int d = 0; d < head_dim; d++) acc[g][d] *= shrink;
            for (int t = 0; t < n; t++) {
                s[g][t] = expf(s[g][t] - mb);
                l[g] += s[g][t];
            }
            m[g] = mb;
        }
        for (int t = 0; t < n; t++) {           /* weighted values */
            const long at = base + t * token_stride;
            if (bf16) {
                const uint16_t *v = (const uint16_t *)v_cache + at;
                for (int d = 0; d < head_dim; d++) kf[d] = widen_bf16(v[d]);
            } else {
                memcpy(kf, (const float *)v_cache + at, sizeof(float) * head_dim);
            }
            for (int g = 0; g < group; g++) {
                const float p = s[g][t];
                for (int d = 0; d < head_dim; d++) acc[g][d] += p * kf[d];
            }
        }
    }
    for (int g = 0; g < group; g++) {
        const float inv = 1.f / l[g];
        for (int d = 0; d < head_dim; d++) out[(long)g * head_dim + d] = acc[g][d] * inv;
    }
}


#if defined(__AVX512F__)
#include <immintrin.h>
/* head_dim 64 on AVX-512 (SmolLM2's, Llama's and Qwen's small models'): a row of 64 numbers is 4
   registers; bf16 is widened by a shift as it is loaded. A sequence's heads are done together,
   block by block, so each block (every KV head of it) comes from memory once: 3x faster here
   than one (sequence, KV head) pair at a time, which reads each block once per KV head. The
   next block is asked for (prefetched) while this one is read: blocks lie anywhere in the
   pool, so the CPU cannot guess the next address itself (26 -> 19 ms a 32-row step here). */
static inline __m512 load16(const void *cache, int bf16, long at) {
    if (bf16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + at));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)cache + at);
}

static void attend_seq_d64(const float *q, const void *k_cache, const void *v_cache, int bf16,
                           const int32_t *table, int context_len, float *out, int group,
                           int num_kv_heads, int block_size, float scale) {
    /* one sequence, every head: each block (all its KV heads) is read into the cache once */
    const int heads = group * num_kv_heads;
    __m512 acc[MAX_HEADS][4];
    float m[MAX_HEADS], l[MAX_HEADS], s[MAX_GROUP][MAX_BLOCK];
    for (int h = 0; h < heads; h++) {
        for (int j = 0; j < 4; j++) acc[h][j] = _mm512_setzero_ps();
        m[h] = -3.0e38f;
        l[h] = 0.f;
    }
    const long token_stride = (long)num_kv_heads * 64;
    for (int start = 0; start < context_len; start += block_size) {
        const int n = context_len - start < block_size ? context_len - start : block_size;
        const long block = ((long)table[start / block_size] * block_size) * token_stride;
        if (start + block_size < context_len) {  /* ask for the next block while this one is read */
            const long next = ((long)table[start / block_size + 1] * block_size) * token_stride;
            const long bytes = (long)block_size * token_stride * (bf16 ? 2 : 4);
            const char *nk = (const char *)k_cache + next * (bf16 ? 2 : 4);
            const char *nv = (const char *)v_cache + next * (bf16 ? 2 : 4);
            for (long b = 0; b < bytes; b += 64) {
                __builtin_prefetch(nk + b);
                __builtin_prefetch(nv + b);
            }
        }
        for (int kv = 0; kv < num_kv_heads; kv++) {
            const long base = block + (long)kv * 64;
            const int h0 = kv * group;
            __m512 qv[MAX_GROUP][4], av[MAX_GROUP][4];
            for (int g = 0; g < group; g++)
                for (int j = 0; j < 4; j++) {
                    qv[g][j] = _mm512_mul_ps(_mm512_loadu_ps(q + (h0 + g) * 64 + 16 * j), _mm512_set1_ps(scale));
                    av[g][j] = acc[h0 + g][j];
                }
            for (int t = 0; t < n; t++) {
                const long at = base + t * token_stride;
                __m512 k0 = load16(k_cache, bf16, at), k1 = load16(k_cache, bf16, at + 16);
                __m512 k2 = load16(k_cache, bf16, at + 32), k3 = load16(k_cache, bf16, at + 48);
                for (int g = 0; g < group; g++) {
                    __m512 d = _mm512_mul_ps(qv[g][0], k0);
                    d = _mm512_fmadd_ps(qv[g][1], k1, d);
                    d = _mm512_fmadd_ps(qv[g][2], k2, d);
                    d = _mm512_fmadd_ps(qv[g][3], k3, d);
                    s[g][t] = _mm512_reduce_add_ps(d);
                }
            }
            for (int g = 0; g < group; g++) {
                const int h = h0 + g;
                float mb = m[h];
                for (int t = 0; t < n; t++) mb = s[g][t] > mb ? s[g][t] : mb;
                const float shrink = start == 0 ? 0.f : expf(m[h] - mb);
                l[h] *= shrink;
                const __m512 sh = _mm512_set1_ps(shrink);
                for (int j = 0; j < 4; j++) av[g][j] = _mm512_mul_ps(av[g][j], sh);
                for (int t = 0; t < n; t++) {
                    s[g][t] = expf(s[g][t] - mb);
                    l[h] += s[g][t];
                }
                m[h] = mb;
            }
            for (int t = 0; t < n; t++) {
                const long at = base + t * token_stride;
                __m512 v0 = load16(v_cache, bf16, at), v1 = load16(v_cache, bf16, at + 16);
                __m512 v2 = load16(v_cache, bf16, at + 32), v3 = load16(v_cache, bf16, at + 48);
                for (int g = 0; g < group; g++) {
                    const __m512 p = _mm512_set1_ps(s[g][t]);
                    av[g][0] = _mm512_fmadd_ps(p, v0, av[g][0]);
                    av[g][1] = _mm512_fmadd_ps(p, v1, av[g][1]);
                    av[g][2] = _mm512_fmadd_ps(p, v2, av[g][2]);
                    av[g][3] = _mm512_fmadd_ps(p, v3, av[g][3]);
                }
            }
            for (int g = 0; g < group; g++)
                for (int j = 0; j < 4; j++) acc[h0 + g][j] = av[g][j];
        }
    }
    for (int h = 0; h < heads; h++) {
        const __m512 inv = _mm512_set1_ps(1.f / l[h]);
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(out + h * 64 + 16 * j, _mm512_mul_ps(acc[h][j], inv));
    }
}
#endif

int paged_decode(const float *q, const void *k_cache, const void *v_cache, int bf16,
                 const int32_t *block_tables, int table_stride, const int32_t *context_lens,
                 float *out, int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                 int block_size, float scale, int threads) {
    const int group = num_heads / num_kv_heads;
    if (group > MAX_GROUP || head_dim > MAX_DIM || block_size > MAX_BLOCK) return 1;
#if defined(__AVX512F__)
    if (head_dim == 64 && num_heads <= MAX_HEADS) {
        #pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int seq = 0; seq < num_seqs; seq++)
            attend_seq_d64(q + (long)seq * num_heads * 64, k_cache, v_cache, bf16,
                           block_tables + (long)seq * table_stride, context_lens[seq],
                           out + (long)seq * num_heads * 64, group, num_kv_heads, block_size, scale);
        return 0;
    }
#endif
    const int pairs = num_seqs * num_kv_heads;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int i = 0; i < pairs; i++) {
        const int seq = i / num_kv_heads, h = i % num_kv_heads;
        const long row = ((long)seq * num_heads + (long)h * group) * head_dim;
        attend_pair(q + row, k_cache, v_cache, bf16, block_tables + (long)seq * table_stride,
                    context_lens[seq], out + row, group, h, num_kv_heads, head_dim, block_size, scale);
    }
    return 0;
}
"""

MAX_GROUP, MAX_DIM, MAX_BLOCK = 16, 256, 256  # the kernel's stack arrays (as in SOURCE)
# -ffast-math lets gcc call the vectorised expf and reorder the sums (3x faster here); the kernel
# never holds an inf or a NaN (the running maximum starts at the first block, not at -inf).
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-ffast-math"]


def cache_dir() -> Path:
    return Path(os.environ.get("MINIPAGED_CACHE", Path.home() / ".cache" / "minipaged")) / "native"


def _cpu_flags() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line for line in info.splitlines() if line.startswith("flags")), "")


def _build(compiler: str) -> Path:
    """Compile SOURCE into the cache (once per source, flags and compiler); returns the library."""
    # -march=native: the library fits this CPU only, so the CPU's flags are part of its name
    key = hashlib.sha256("\n".join([SOURCE, compiler, *FLAGS, _cpu_flags()]).encode()).hexdigest()[:16]
    lib = cache_dir() / f"paged_decode-{key}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        src, built = Path(tmp) / "paged_decode.c", Path(tmp) / "paged_decode.so"
        src.write_text(SOURCE)
        subprocess.run([compiler, *FLAGS, str(src), "-o", str(built), "-lm"], check=True, capture_output=True)
        os.replace(built, lib)  # atomic: a process racing this one loads a whole library or builds its own
    return lib


@cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None (said once, on stderr) where no C compiler builds it.

    ``MINIPAGED_NATIVE=0`` turns it off (the plain-torch path then runs everywhere)."""
    if os.environ.get("MINIPAGED_NATIVE", "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        print(
            "minipaged: no C compiler found (cc or $CC): decode attention gathers each context with "
            "plain torch instead of reading the blocks in place (slower, same results)",
            file=sys.stderr,
        )
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = e.stderr.decode(errors="replace")[-300:] if isinstance(e, subprocess.CalledProcessError) else e
        print(f"minipaged: the decode attention kernel did not build, plain torch instead: {detail}", file=sys.stderr)
        return None
    lib.paged_decode.restype = ctypes.c_int
    return lib


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel takes this step: CPU tensors, fp32 or bf16 cache, shapes within its arrays."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    return (
        q.device.type == "cpu"
        and k_cache.dtype in (torch.float32, torch.bfloat16)
        and q.shape[1] % num_kv_heads == 0
        and q.shape[1] // num_kv_heads <= MAX_GROUP
        and head_dim <= MAX_DIM
        and block_size <= MAX_BLOCK
    )


def paged_decode(
    lib: ctypes.CDLL,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """One query token per sequence attends to its paged context -> ``[num_seqs, num_heads, head_dim]`` fp32.

    Shapes as in the module's docstring; every sequence must have ``context_len >= 1``."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    q = q.float().contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()  # a layer's slice already is: no copy
    out = torch.empty_like(q)
    status = lib.paged_decode(
        ctypes.c_void_p(q.data_ptr()),
        ctypes.c_void_p(k_cache.data_ptr()),
        ctypes.c_void_p(v_cache.data_ptr()),
        ctypes.c_int(k_cache.dtype == torch.bfloat16),
        ctypes.c_void_p(tables.data_ptr()),
        ctypes.c_int(tables.shape[1]),
        ctypes.c_void_p(lens.data_ptr()),
        ctypes.c_void_p(out.data_ptr()),
        ctypes.c_int(num_seqs),
        ctypes.c_int(num_heads),
        ctypes.c_int(num_kv_heads),
        ctypes.c_int(head_dim),
        ctypes.c_int(block_size),
        ctypes.c_float(head_dim**-0.5 if scale is None else scale),
        ctypes.c_int(threads or torch.get_num_threads()),
    )
    if status:
        raise ValueError(f"paged_decode: shapes beyond the kernel's arrays ({num_heads=}, {head_dim=}, {block_size=})")
    return out
