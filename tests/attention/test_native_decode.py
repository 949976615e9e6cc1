"""Decode attention read in place (the compiled kernel) against the oracle, and its fallback:
where no C compiler builds it, the plain-torch gather runs instead and says so once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_attention import HEAD_LAYOUTS, make_batch, paged_batches

from minipaged.attention import native_decode, reference
from minipaged.attention.batched import TorchBackend

lib = native_decode.load()
needs_kernel = pytest.mark.skipif(lib is None, reason="no C compiler built the decode kernel here")


def backend_attend(backend: TorchBackend, q, k_cache, v_cache, meta):
    return backend.attend(q, k_cache, v_cache, meta, backend.plan(meta, k_cache.shape[1]))


@needs_kernel
@settings(max_examples=80, deadline=None)
@given(paged_batches(), st.sampled_from([torch.float32, torch.bfloat16]))
def test_in_place_backend_equals_the_reference_on_any_batch(batch, dtype):
    """Decode rows through the kernel, prefill rows through the gather, in one step."""
    q, k_cache, v_cache, meta = make_batch(*batch)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    args = (q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens)
    got = backend_attend(TorchBackend(in_place=True), q, k_cache, v_cache, meta)
    torch.testing.assert_close(got, reference.paged_prefill_attention(*args), rtol=1e-5, atol=2e-5)


@needs_kernel
@pytest.mark.parametrize(("heads", "kv_heads"), HEAD_LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_kernel_reads_long_scattered_contexts(heads, kv_heads, block_size):
    lens = [1, 700, 33, 1024, 16, 17]
    q, k_cache, v_cache, meta = make_batch(block_size, heads, kv_heads, 64, [1] * 6, lens, seed=7)
    got = native_decode.paged_decode(lib, q, k_cache, v_cache, meta.block_tables, meta.context_lens)
    want = reference.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    one_thread = native_decode.paged_decode(lib, q, k_cache, v_cache, meta.block_tables, meta.context_lens, threads=1)
    torch.testing.assert_close(one_thread, got, rtol=1e-6, atol=1e-6)


@needs_kernel
def test_in_place_plan_keeps_decode_rows_in_one_group():
    """No padding to save: the kernel reads each context's own length."""
    lens = [4, 300, 8, 5, 290, 6, 7, 310, 280, 9]
    q, k_cache, v_cache, meta = make_batch(16, 8, 2, 16, [1] * 10, lens, seed=4)
    assert len(TorchBackend(in_place=False).plan(meta, 16).decode) == 2
    (decode,) = TorchBackend(in_place=True).plan(meta, 16).decode
    assert decode.context_lens.tolist() == lens and decode.tables.dtype == torch.int32


def test_kernel_refuses_shapes_beyond_its_arrays():
    q, k_cache = torch.zeros(1, 40, 8), torch.zeros(2, 4, 2, 8)  # 20 query heads a KV head
    assert not native_decode.supports(q, k_cache)
    assert native_decode.supports(torch.zeros(1, 8, 8), k_cache)
    assert not native_decode.supports(torch.zeros(1, 8, 8), k_cache.half())


FALLBACK = textwrap.dedent(
    """
    import sys
    import torch
    sys.path.insert(0, "tests/attention")
    from minipaged.attention import reference
    from minipaged.attention.batched import TorchBackend
    from test_attention import make_batch
    backend = TorchBackend()
    assert backend.lib is None, "no compiler: no kernel"
    TorchBackend()  # a second backend: nothing said again
    q, k, v, meta = make_batch(4, 8, 2, 16, [1, 1, 3], [9, 30, 3], seed=1)
    got = backend.attend(q, k, v, meta, backend.plan(meta, 4))
    args = (q, k, v, meta.block_tables, meta.cu_seqlens_q, meta.context_lens)
    torch.testing.assert_close(got, reference.paged_prefill_attention(*args), rtol=1e-5, atol=1e-5)
    print("fallback ok")
    """
)


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"CC": "/nonexistent/cc"}, "no C compiler found"),
        ({"CC": "false"}, "did not build"),
        ({"MINIPAGED_NATIVE": "0"}, None),
    ],
)
def test_without_a_compiler_the_gather_runs_and_says_so_once(tmp_path, env, said):
    """A fresh process, as a user starts one: nothing cached, no compiler (or one that fails)."""
    run_env = {**os.environ, "MINIPAGED_CACHE": str(tmp_path), **env}
    done = subprocess.run(
        [sys.executable, "-c", FALLBACK], capture_output=True, text=True, env=run_env, cwd=os.getcwd(), timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "fallback ok" in done.stdout
    if said is None:
        assert "minipaged:" not in done.stderr
    else:
        assert done.stderr.count("minipaged:") == 1 and said in done.stderr
    assert not list(tmp_path.rglob("*.so"))


@needs_kernel
def test_a_fresh_cache_builds_the_kernel_once(tmp_path):
    code = (
        "from minipaged.attention import native_decode as n; "
        "assert n.load() is not None; print(sorted(p.name for p in n.cache_dir().iterdir()))"
    )
    env = {**os.environ, "MINIPAGED_CACHE": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert first.stdout == again.stdout and first.stdout.count(".so") == 1 and not first.stderr
