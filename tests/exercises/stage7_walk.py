"""How the capstone's checks (``test_stage7_capstone.py``) build their cases and say what went wrong.

The oracle is ``minipaged.attention.reference``: :func:`attend` is ``causal_attention`` over one
sequence's K/V gathered through its block table. :func:`check_walk` explains a wrong program of a
kernel that walks a sequence block by block: it re-runs the learner's kernel with the context cut
at the end of each block, so the first cut that comes back wrong names the loop step (and the
logical and physical block, ``tiled.program_reads``), says what the running max did at that step
(``tiled.online_softmax_trace``), and names the likely mistake whose result is exactly the output
that came back, when one is. Kept out of the test module so that a failure's ``check:`` line is
the check's own call, not a line in here.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from minipaged.attention.reference import causal_attention, gather_kv
from minipaged.kernels.tiled import online_softmax_trace, program_reads
from minipaged.utils import cdiv

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}  # atol = rtol, by the output's dtype


def caches(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype=torch.float32, seed: int = 0):
    """Random K and V caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, each the middle of a
    buffer whose first and last blocks hold NaN."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in "kv":
        buf = torch.full((num_blocks + 2, block_size, num_kv_heads, head_dim), float("nan"))
        buf[1:-1] = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
        out.append(buf.to(dtype)[1:-1])
    return out


def randn(*shape: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def table_of(num_blocks: int, n: int, width: int, seed: int) -> torch.Tensor:
    """A shuffled block table: ``n`` distinct ids of the pool, padded with 0 to ``width`` (as the engine pads)."""
    ids = random.Random(seed).sample(range(num_blocks), n)
    return torch.tensor(ids + [0] * (width - n), dtype=torch.int32)


def attend(q, k_cache, v_cache, table, context_len: int, kv_head: int, scale: float | None = None) -> torch.Tensor:
    """The oracle for one query head q ``[head_dim]``: ``causal_attention`` over the gathered K/V, fp32."""
    table = torch.as_tensor(table)
    k = gather_kv(k_cache, table, context_len)[:, kv_head : kv_head + 1].float()
    v = gather_kv(v_cache, table, context_len)[:, kv_head : kv_head + 1].float()
    return causal_attention(q.float()[None, None], k, v, scale)[0, 0]


def close(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Per element: got agrees with want to the tolerance of got's dtype."""
    tol = TOL[got.dtype]
    return torch.isclose(got.float(), want.float(), rtol=tol, atol=tol)


def shown(x: torch.Tensor, n: int = 5) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in x.flatten()[:n].tolist()) + (", ...]" if x.numel() > n else "]")


def differs(what: str, want: torch.Tensor, got: torch.Tensor, likely: list[tuple[str, torch.Tensor]] = ()) -> str:
    """The message's head: what was computed, want and got, a NaN note, and the first likely mistake that fits."""
    lines = [what, f"want {shown(want)}", f"got  {shown(got)}"]
    if bool(got.isnan().any()):
        lines.append("NaN in your output: an unmasked load read outside the cache (its guard blocks hold NaN), or 0/0")
    fits = [words for words, result in likely if bool(close(got, result).all())]
    return "\n".join(lines + ([f"hint: that is {fits[0]}"] if fits else []))


def walk(run: Callable[[int], torch.Tensor], q, k_cache, v_cache, table, context_len, kv_head, scale) -> str:
    """Where one program's walk goes wrong. ``run(end)``: its output with the context cut to ``end``
    positions; the first end of a block where it differs from the oracle names the loop step."""
    block_size = k_cache.shape[1]
    steps = program_reads(table.tolist(), context_len, block_size, block_size)  # one block per loop step
    used = table[: len(steps)].tolist()
    keys = gather_kv(k_cache, table, context_len)[:, kv_head].float()
    trace = online_softmax_trace(keys @ q.float() * (q.shape[-1] ** -0.5 if scale is None else scale), block_size)
    lines = [f"its walk: {len(steps)} loop step{'s' * (len(steps) != 1)} of one block, block_table {used}"]
    for j, (read,) in enumerate(steps):
        end = min(context_len, (j + 1) * block_size)
        if bool(close(run(end), attend(q, k_cache, v_cache, table, end, kv_head, scale)).all()):
            continue
        tail = f", the tail: {read.num_positions} of {block_size} slots" if read.num_positions < block_size else ""
        lines.append(
            f"your kernel on the first blocks only: {f'right through step {j - 1}, ' if j else ''}first wrong at "
            f"step {j}: logical block {read.logical} -> physical block {read.physical}, positions "
            f"{j * block_size}..{end - 1}{tail}"
        )
        if j:
            m0, m1, alpha = float(trace["m"][j - 1]), float(trace["m"][j]), float(trace["alpha"][j])
            rise = f"rises {m0:.3g} -> {m1:.3g} (alpha = {alpha:.3g})" if m1 > m0 else f"stays at {m0:.3g}"
            lines.append(f"online_softmax_trace of its scores: at step {j} the running max {rise}")
        break
    else:  # the last re-run is the launch that failed: only a kernel that reads memory it never set gets here
        lines.append("your kernel on the first blocks only: right at every step, this time (uninitialised memory?)")
    lines.append(f"draw it: minipaged.viz.kernel.draw_program_reads({used}, {context_len}, {block_size}, {block_size})")
    return "\n".join(lines)


def check_walk(got, run, what: str, q, k_cache, v_cache, table, context_len, kv_head, scale=None, likely=()) -> None:
    """One program of a kernel that walks blocks (puzzles 3-6): fail with where it goes wrong unless it is right."""
    table = torch.as_tensor(table)
    want = attend(q, k_cache, v_cache, table, context_len, kv_head, scale)
    if bool(close(got, want).all()):
        return
    last = cdiv(context_len, k_cache.shape[1]) - 1
    in_last = context_len - last * k_cache.shape[1]
    likely = [
        *likely,
        (
            "attention over the last block only: the state starts over at every step (is m carried over?)",
            attend(q, k_cache, v_cache, table[last:], in_last, kv_head, scale),
        ),
        (
            "attention over blocks 0, 1, 2, ...: step j reads block j, not block_table[j]",
            attend(q, k_cache, v_cache, torch.arange(last + 1), context_len, kv_head, scale),
        ),
    ]
    head = differs(f"{what}: differs from attention over its context", want, got, likely)
    raise AssertionError(head + "\n" + walk(run, q, k_cache, v_cache, table, context_len, kv_head, scale))
