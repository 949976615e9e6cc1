"""Stage 4 exercises: the store kernel in Triton, online softmax, the causal stop, the cost model (notebook 04)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from exercises.stage4_triton import store_kvcache as launch_store  # the given launcher: one program per token
from minipaged.attention.reference import causal_attention, store_kvcache
from minipaged.kernels.tiled import online_softmax_trace, program_reads
from minipaged.utils import cdiv

STAGE = "stage4_triton"
DEVICE = "cpu"  # the kernel runs in Triton's interpreter, on a GPU machine too: print() works, no compile step


def guarded_caches(num_blocks: int, block_size: int, heads: int, dim: int, dtype: torch.dtype, seed: int):
    """Random K and V caches ``[num_blocks, ...]``, each the middle of a buffer with one guard block
    before and after: a write outside the cache lands in a guard (not in other memory) and is seen."""
    g = torch.Generator().manual_seed(seed)
    bufs = [torch.randn(num_blocks + 2, block_size, heads, dim, generator=g).to(dtype).to(DEVICE) for _ in "kv"]
    return bufs, [b[1:-1] for b in bufs]


def store_and_compare(ex, key, value, slots, bufs, what: str) -> None:
    """Your kernel and ``minipaged.attention.reference.store_kvcache`` on copies of the same caches."""
    want = [b.clone() for b in bufs]
    store_kvcache(key, value, want[0][1:-1], want[1][1:-1], slots)
    launch_store(key, value, bufs[0][1:-1], bufs[1][1:-1], slots, kernel=ex.store_kvcache_kernel)
    for name, got, ref in (("k_cache", bufs[0], want[0]), ("v_cache", bufs[1], want[1])):
        for guard, side in ((0, "before its first"), (-1, "after its last")):
            assert torch.equal(got[guard], ref[guard]), (
                f"{what}: your kernel wrote outside {name}, {side} slot: slot -1 must write nothing, "
                f"and the lanes D .. D_PAD - 1 must be masked"
            )
        flat_got, flat_ref = got[1:-1].flatten(0, 1), ref[1:-1].flatten(0, 1)  # [num_slots, heads, dim]
        wrong = (flat_got != flat_ref).flatten(1).any(dim=1).nonzero().flatten().tolist()
        if wrong:
            writers = [t for t, slot in enumerate(slots.tolist()) if slot == wrong[0]]
            detail = f"token {writers[0]} goes there" if writers else "no token goes there: keep its old contents"
            raise AssertionError(
                f"{what}, slot_mapping {slots.tolist()}: {name} differs from store_kvcache in "
                f"slots {wrong[:8]}; slot {wrong[0]}: {detail}"
            )


@pytest.mark.exercise("store_kvcache_kernel")
def test_store_kvcache_kernel_example(ex):
    """The running example, block size 16: A's token 23 goes to slot 55 (block 3, offset 7), B's token 19 to
    slot 147 (block 9, offset 3); the token between them is padding."""
    bufs, (k_cache, v_cache) = guarded_caches(10, 16, 2, 4, torch.float32, seed=0)
    key = torch.arange(3 * 8, dtype=torch.float32, device=DEVICE).reshape(3, 2, 4)
    slots = torch.tensor([55, -1, 147], device=DEVICE)
    store_and_compare(ex, key, -key, slots, bufs, "3 tokens, 2 KV heads of 4")
    assert torch.equal(k_cache[3, 7], key[0]) and torch.equal(v_cache[9, 3], -key[2])


STORE_CASES = [  # (block size, KV heads, head dim, dtype)
    (16, 2, 16, torch.float32),  # D = 32, a power of two
    (4, 3, 8, torch.float32),  # D = 24: 8 masked lanes
    (1, 1, 5, torch.float16),
    (8, 2, 4, torch.bfloat16),
]


@pytest.mark.exercise("store_kvcache_kernel")
@pytest.mark.parametrize(
    "block_size,heads,dim,dtype", STORE_CASES, ids=[f"bs{c[0]}-D{c[1] * c[2]}-{str(c[3])[6:]}" for c in STORE_CASES]
)
def test_store_kvcache_kernel_matches_reference(ex, block_size, heads, dim, dtype):
    rng = random.Random(block_size * heads)
    num_blocks = 6
    num_tokens = rng.randint(5, 20)
    slots = rng.sample(range(num_blocks * block_size), min(num_tokens, num_blocks * block_size))
    slots += [-1] * (num_tokens - len(slots))
    for t in rng.sample(range(num_tokens), num_tokens // 4):
        slots[t] = -1  # padding tokens here and there
    slots = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    g = torch.Generator().manual_seed(1)
    key, value = (torch.randn(num_tokens, heads, dim, generator=g).to(dtype).to(DEVICE) for _ in "kv")
    bufs, _ = guarded_caches(num_blocks, block_size, heads, dim, dtype, seed=2)
    store_and_compare(ex, key, value, slots, bufs, f"{num_tokens} tokens, {heads} KV heads of {dim}, {dtype}")


@pytest.mark.exercise("store_kvcache_kernel")
def test_store_kvcache_kernel_strided_rows(ex):
    """K and V as the model makes them: slices of one packed QKV projection, so a row is not D apart."""
    heads, kv_heads, dim, num_tokens = 4, 2, 8, 7
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * dim, generator=torch.Generator().manual_seed(3))
    qkv = qkv.to(DEVICE)
    key = qkv[:, heads * dim : (heads + kv_heads) * dim].view(num_tokens, kv_heads, dim)
    value = qkv[:, (heads + kv_heads) * dim :].view(num_tokens, kv_heads, dim)
    assert key.stride(0) == qkv.shape[1] != kv_heads * dim
    bufs, _ = guarded_caches(4, 4, kv_heads, dim, torch.float32, seed=4)
    slots = torch.tensor([3, 4, 5, -1, 12, 13, 0], device=DEVICE)
    store_and_compare(ex, key, value, slots, bufs, "key/value rows key.stride(0) apart (a packed projection)")


@pytest.mark.exercise("store_kvcache_kernel")
def test_store_kvcache_kernel_padding_writes_nothing(ex):
    bufs, _ = guarded_caches(2, 4, 1, 3, torch.float32, seed=5)
    before = [b.clone() for b in bufs]
    key = torch.ones(5, 1, 3, device=DEVICE)
    launch_store(
        key, key, bufs[0][1:-1], bufs[1][1:-1], torch.full((5,), -1, device=DEVICE), kernel=ex.store_kvcache_kernel
    )
    assert all(torch.equal(b, a) for a, b in zip(before, bufs)), "5 padding tokens (slot -1) must write nothing"
    store_and_compare(ex, key, key, torch.tensor([7, -1, 0, -1, 4], device=DEVICE), bufs, "the first and last slots")


def init_state(rows: int, head_dim: int):
    return torch.full((rows,), -1e30), torch.zeros(rows), torch.zeros(rows, head_dim)


def run_tiles(ex, scores: torch.Tensor, v: torch.Tensor, block_n: int):
    """Fold scores [rows, n] and v [n, d] tile by tile; returns the states after each tile."""
    m, l, acc = init_state(scores.shape[0], v.shape[1])  # noqa: E741
    states = []
    for start in range(0, scores.shape[1], block_n):
        m, l, acc = ex.online_softmax_update(m, l, acc, scores[:, start : start + block_n], v[start : start + block_n])  # noqa: E741
        states.append((m.clone(), l.clone(), acc.clone()))
    return states


def causal_scores(rows: int, n: int, seed: int) -> torch.Tensor:
    """Random scores with a causal mask: row i sees keys 0 .. n - rows + i."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(rows, n, generator=g) * 3
    visible = torch.arange(n)[None, :] <= (n - rows + torch.arange(rows))[:, None]
    return s.masked_fill(~visible, float("-inf"))


@pytest.mark.exercise("online_softmax_update")
@pytest.mark.parametrize("block_n", [1, 7, 16, 50])
def test_online_softmax_equals_softmax(ex, block_n):
    scores = causal_scores(rows=6, n=50, seed=block_n)
    v = torch.randn(50, 8, generator=torch.Generator().manual_seed(1))
    m, l, acc = run_tiles(ex, scores, v, block_n)[-1]  # noqa: E741
    want = torch.softmax(scores, dim=-1) @ v
    assert not torch.isnan(acc).any() and not torch.isnan(l).any(), "NaN in the state"
    torch.testing.assert_close(
        acc / l[:, None],
        want,
        rtol=1e-5,
        atol=1e-5,
        msg=lambda msg: f"tiles of {block_n}: acc / l != softmax(scores) @ v\n{msg}",
    )


@pytest.mark.exercise("online_softmax_update")
def test_online_softmax_state_after_each_tile(ex):
    """After each tile: m = max seen, l = sum exp(seen - m), acc = sum exp(seen - m) v (un-normalised)."""
    scores = causal_scores(rows=4, n=24, seed=3)
    v = torch.randn(24, 5, generator=torch.Generator().manual_seed(2))
    for k, (m, l, acc) in enumerate(run_tiles(ex, scores, v, 8)):  # noqa: E741
        seen, v_seen = scores[:, : 8 * (k + 1)], v[: 8 * (k + 1)]
        m_want = seen.max(dim=1).values.clamp(min=-1e30)
        p = torch.exp(seen - m_want[:, None])
        torch.testing.assert_close(m, m_want, msg=lambda msg, k=k: f"running max m after tile {k}\n{msg}")
        torch.testing.assert_close(l, p.sum(1), msg=lambda msg, k=k: f"running sum l after tile {k}\n{msg}")
        torch.testing.assert_close(acc, p @ v_seen, msg=lambda msg, k=k: f"acc after tile {k} (not normalised)\n{msg}")


@pytest.mark.exercise("online_softmax_update")
def test_online_softmax_matches_viz_trace(ex):
    """Against minipaged.kernels.tiled.online_softmax_trace (float64), one row."""
    row = [0.5, 2.0, -1.0, 4.0, 3.5, -2.0, 6.0, 0.0, 1.0]
    trace = online_softmax_trace(row, block_n=3)
    states = run_tiles(ex, torch.tensor([row]), torch.ones(len(row), 1), 3)
    assert [float(m[0]) for m, _, _ in states] == pytest.approx(trace["m"].tolist(), rel=1e-6)
    assert [float(s[0]) for _, s, _ in states] == pytest.approx(trace["l"].tolist(), rel=1e-5)


@pytest.mark.exercise("online_softmax_update")
def test_online_softmax_fully_masked_tile(ex):
    """Row 0 sees nothing in the first tile (a causal tile ahead of it): no NaN, state unchanged."""
    scores = torch.tensor([[float("-inf")] * 4 + [1.0, 2.0, 3.0, 4.0], [1.0] * 8])
    v = torch.arange(16.0).reshape(8, 2)
    first, last = run_tiles(ex, scores, v, 4)
    m, l, acc = first  # noqa: E741
    assert not (torch.isnan(m).any() or torch.isnan(l).any() or torch.isnan(acc).any()), "NaN after a masked tile"
    unchanged = float(m[0]) == float(torch.tensor(-1e30)) and float(l[0]) == 0 and acc[0].abs().sum() == 0
    assert unchanged, "a masked tile must change nothing"
    torch.testing.assert_close(last[2] / last[1][:, None], torch.softmax(scores, -1) @ v)


@pytest.mark.exercise("online_softmax_update")
def test_online_softmax_is_paged_attention(ex):
    """One head of a prefill chunk: tile-by-tile output == the package's causal_attention."""
    g = torch.Generator().manual_seed(0)
    q_len, context_len, head_dim = 5, 21, 16
    q = torch.randn(q_len, 1, head_dim, generator=g)
    k = torch.randn(context_len, 1, head_dim, generator=g)
    v = torch.randn(context_len, 1, head_dim, generator=g)
    scores = (q[:, 0] @ k[:, 0].T) * head_dim**-0.5
    pos = torch.arange(context_len - q_len, context_len)
    scores = scores.masked_fill(torch.arange(context_len)[None, :] > pos[:, None], float("-inf"))
    m, l, acc = run_tiles(ex, scores, v[:, 0], 4)[-1]  # noqa: E741
    torch.testing.assert_close(acc / l[:, None], causal_attention(q, k, v)[:, 0], rtol=1e-5, atol=1e-5)


def kv_end_by_definition(context_len: int, q_len: int, q_tile: int, block_q: int) -> int:
    queries = [i for i in range(q_tile * block_q, (q_tile + 1) * block_q) if i < q_len]
    return max(context_len - q_len + i for i in queries) + 1


@pytest.mark.exercise("tile_kv_end")
def test_tile_kv_end_examples(ex):
    assert ex.tile_kv_end(57, 1, 0, 1) == 57, "a decode sees its whole context"
    assert ex.tile_kv_end(100, 100, 0, 16) == 16
    assert ex.tile_kv_end(100, 100, 6, 16) == 100, "the last tile is cut at the context's end"
    assert ex.tile_kv_end(100, 20, 0, 16) == 96, "a chunk after 80 cached tokens: tile 0 holds queries at 80..95"
    assert ex.tile_kv_end(100, 20, 1, 16) == 100


@pytest.mark.exercise("tile_kv_end")
def test_tile_kv_end_by_definition(ex):
    for context_len in (1, 5, 16, 33, 100):
        for q_len in sorted({1, 2, min(7, context_len), context_len}):
            for block_q in (1, 4, 16):
                for q_tile in range(cdiv(q_len, block_q)):
                    want = kv_end_by_definition(context_len, q_len, q_tile, block_q)
                    got = ex.tile_kv_end(context_len, q_len, q_tile, block_q)
                    assert got == want, (
                        f"context_len {context_len}, q_len {q_len}, tile {q_tile} of {block_q}: "
                        f"its last query sees key {want - 1}, so kv_end = {want}; got {got}"
                    )


@pytest.mark.exercise("tile_kv_end")
def test_tile_kv_end_keys_past_it_do_not_matter(ex):
    """With the package's causal_attention: the tile's output needs no key at or past kv_end."""
    g = torch.Generator().manual_seed(1)
    context_len, q_len, block_q = 30, 12, 4
    q = torch.randn(q_len, 2, 8, generator=g)
    k, v = torch.randn(2, context_len, 2, 8, generator=g)
    full = causal_attention(q, k, v)
    for t in range(q_len // block_q):
        end = ex.tile_kv_end(context_len, q_len, t, block_q)
        rows = slice(t * block_q, (t + 1) * block_q)
        # the tile's queries against keys 0 .. end - 1 only: same positions, so shift q_len accordingly
        visible_q = q_len - (context_len - end)
        cut = causal_attention(q[:visible_q], k[:end], v[:end])[rows]
        note = f"tile {t}: attention over keys 0..{end - 1} only differs"
        torch.testing.assert_close(cut, full[rows], msg=lambda msg, note=note: f"{note}\n{msg}")


def loop_steps_by_walk(q_lens, context_lens, num_kv_heads, block_q, block_n) -> int:
    """Count with minipaged.kernels.tiled.program_reads, one program at a time."""
    num_tiles = cdiv(max(q_lens), block_q)
    steps = 0
    for q_len, context_len in zip(q_lens, context_lens):
        table = list(range(context_len))  # block size 1: any table works for counting
        for _ in range(num_kv_heads):
            for t in range(num_tiles):
                if t * block_q < q_len:
                    end = kv_end_by_definition(context_len, q_len, t, block_q)
                    steps += len(program_reads(table, context_len, 1, block_n, end))
    return steps


@pytest.mark.exercise("count_loop_steps")
def test_count_loop_steps_examples(ex):
    # docs/stage4.md: one 256-token decode, 2 KV heads, took 32 program-steps at block_n=16, 2 at 256
    assert ex.count_loop_steps([1], [256], 2, 1, 16) == 32
    assert ex.count_loop_steps([1], [256], 2, 1, 256) == 2
    assert ex.count_loop_steps([1] * 4, [256] * 4, 2, 1, 16) == 128
    # a 100-token prompt, tiles of 16 queries x 32 keys, 1 KV head: tiles stop at 16, 32, ..., 96, 100
    assert ex.count_loop_steps([100], [100], 1, 16, 32) == 1 + 1 + 2 + 2 + 3 + 3 + 4
    # the grid is sized by the longest sequence: the short one's extra tiles run nothing
    assert ex.count_loop_steps([100, 3], [100, 3], 1, 16, 32) == 16 + 1
    assert ex.count_loop_steps([0, 5], [10, 5], 2, 16, 32) == 2, "a sequence with no new token runs nothing"


@pytest.mark.exercise("count_loop_steps")
def test_count_loop_steps_against_the_walk(ex):
    cases = [([1, 1, 1], [64, 300, 17], 2), ([40, 7, 1], [40, 100, 9], 4), ([128], [512], 1), ([5, 33], [80, 33], 3)]
    for q_lens, context_lens, heads in cases:
        for block_q, block_n in ((1, 16), (16, 32), (64, 64), (128, 256)):
            want = loop_steps_by_walk(q_lens, context_lens, heads, block_q, block_n)
            got = ex.count_loop_steps(q_lens, context_lens, heads, block_q, block_n)
            assert got == want, (
                f"q_lens {q_lens}, context_lens {context_lens}, {heads} KV heads, "
                f"block_q {block_q}, block_n {block_n}: want {want}, got {got}"
            )
    assert math.isclose(ex.count_loop_steps([1], [1], 1, 1, 16), 1)
