"""Stage 7, the capstone: paged attention kernels in seven Triton puzzles, each against the oracle.

Every puzzle runs in Triton's interpreter through the launchers of ``exercises/launchers.py``
and is compared with ``minipaged.attention.reference`` on random caches whose first and last
blocks are NaN guards (an unmasked read past the cache shows as NaN). The slots past a
sequence's context hold other random numbers, so a tail that is not masked changes the answer.
A wrong kernel that walks blocks is explained by ``stage7_walk.check_walk``: the program, the
first loop step that goes wrong, what the running max did there, the likely mistake.
"""

from __future__ import annotations

import random

import pytest
import torch
from stage7_walk import (
    attend,
    caches,
    check_walk,
    close,
    differs,
    randn,
    shown,
    table_of,
)  # tests/exercises/stage7_walk.py

from exercises.launchers import (
    block_scores,
    gqa_attention,
    online_attention,
    paged_attention,
    paged_decode_attention,
    paged_prefill_attention,
    tail_attention,
)
from minipaged.attention.reference import causal_attention, gather_kv
from minipaged.attention.reference import paged_decode_attention as reference_decode
from minipaged.utils import cdiv

STAGE = "stage7_capstone"


# ---------------------------------------------------------------------------------------------
# Puzzle 1: one block's scores


@pytest.mark.exercise("block_scores_kernel")
def test_block_scores_kernel_example(ex):
    """Block 1, KV head 1 of a pool whose keys count up: q = [1, 0] picks each key's first number."""
    k_cache = torch.arange(2 * 4 * 2 * 2, dtype=torch.float32).reshape(2, 4, 2, 2)  # 2 blocks of 4 slots, 2 KV heads
    got = block_scores(torch.tensor([1.0, 0.0]), k_cache, 1, 1, scale=1.0, kernel=ex.block_scores_kernel)
    want = k_cache[1, :, 1, 0]  # [18, 22, 26, 30]
    assert torch.equal(got, want), (
        f"block 1, KV head 1, q [1, 0], scale 1: want the first number of each key {want.tolist()}, got {got.tolist()}"
    )


# (block_size, num_kv_heads, head_dim, dtype): bf16 needs .to(tl.float32) after the loads
SCORE_CASES = [
    (1, 1, 4, torch.float32),
    (3, 2, 5, torch.float32),
    (16, 3, 16, torch.bfloat16),
    (4, 2, 24, torch.float16),
]


@pytest.mark.exercise("block_scores_kernel")
@pytest.mark.parametrize("case", SCORE_CASES, ids=[f"bs{c[0]}-kv{c[1]}-d{c[2]}-{str(c[3])[6:]}" for c in SCORE_CASES])
def test_block_scores_kernel_against_torch(ex, case):
    block_size, num_kv_heads, head_dim, dtype = case
    k_cache, _ = caches(5, block_size, num_kv_heads, head_dim, dtype, seed=block_size)
    q = randn(head_dim, seed=1, dtype=dtype)
    scores = torch.einsum("btkd,d->bkt", k_cache.float(), q.float()) * head_dim**-0.5  # [block, kv head, slot]
    for block_id, kv_head in ((0, 0), (4, num_kv_heads - 1), (2, num_kv_heads // 2)):
        got = block_scores(q, k_cache, block_id, kv_head, kernel=ex.block_scores_kernel)
        want = scores[block_id, kv_head]
        wrong = (~close(got, want)).nonzero().flatten().tolist()
        if wrong:
            likely = [("unscaled: multiply by scale", want * head_dim**0.5)]
            likely += [
                (f"block {b}, KV head {h}'s scores", scores[b, h]) for b in range(5) for h in range(num_kv_heads)
            ]
            what = (
                f"block {block_id}, KV head {kv_head} (block_size {block_size}, {num_kv_heads} KV heads, head_dim "
                f"{head_dim}, {str(dtype)[6:]}): slots {wrong} differ; slot {wrong[0]}: want "
                f"{want[wrong[0]]:.5g}, got {got[wrong[0]]:.5g}"
            )
            note = "\n16-bit cache: .to(tl.float32) right after each load? (the interpreter's fp16/bf16 math is wrong)"
            raise AssertionError(differs(what, want, got, likely) + note * (dtype != torch.float32))


# ---------------------------------------------------------------------------------------------
# Puzzle 2: masking the tail


@pytest.mark.exercise("tail_attention_kernel")
def test_tail_attention_kernel_example(ex):
    """Two equal scores in a block of four: the output is the mean of their two values, whatever slots 2-3 hold."""
    k_cache = torch.zeros(1, 4, 1, 2)
    v_cache = torch.tensor([[1.0, 0.0], [3.0, 2.0], [100.0, 100.0], [-50.0, 7.0]]).reshape(1, 4, 1, 2)
    got = tail_attention(torch.ones(2), k_cache, v_cache, 0, 2, 0, kernel=ex.tail_attention_kernel)
    assert torch.allclose(got, torch.tensor([2.0, 1.0])), (
        f"n = 2 of 4 slots, equal scores, values [1, 0] and [3, 2]: want their mean [2, 1], got {shown(got)} "
        "(slots 2-3 hold [100, 100] and [-50, 7]: past n, they must count for nothing)"
    )


@pytest.mark.exercise("tail_attention_kernel")
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_tail_attention_kernel_every_n(ex, block_size):
    k_cache, v_cache = caches(4, block_size, 2, 5, seed=block_size)
    q = randn(5, seed=2) * 2  # peaked scores: one slot too many or too few shows
    for n in sorted({1, 2, block_size // 2, block_size - 1, block_size} & set(range(1, block_size + 1))):
        block_id, kv_head = n % 4, n % 2
        got = tail_attention(q, k_cache, v_cache, block_id, n, kv_head, kernel=ex.tail_attention_kernel)
        want = attend(q, k_cache, v_cache, [block_id], n, kv_head)
        if not bool(close(got, want).all()):
            likely = [
                (f"attention over slots 0..{m - 1}", attend(q, k_cache, v_cache, [block_id], m, kv_head))
                for m in range(1, block_size + 1)
                if m != n
            ]
            ratio = float(got @ want / (want @ want))  # the weights summing to more (or less) than 1
            likely.append((f"the right answer times {ratio:.3g}: masked slots still count in sum(p)?", ratio * want))
            what = f"block {block_id}, KV head {kv_head}, n = {n} of block_size {block_size}"
            raise AssertionError(differs(f"{what}: attention over slots 0..{n - 1} differs", want, got, likely))


# ---------------------------------------------------------------------------------------------
# Puzzles 3-5: one sequence, walked block by block

ONE_SEQ = [(1, [1, 6]), (3, [2, 3, 4, 14]), (16, [5, 16, 40])]  # (block_size, context lengths)
ONE_SEQ_IDS = [f"bs{c[0]}" for c in ONE_SEQ]


@pytest.mark.exercise("online_attention_kernel")
@pytest.mark.parametrize("block_size,lens", ONE_SEQ, ids=ONE_SEQ_IDS)
def test_online_attention_kernel_against_reference(ex, block_size, lens):
    num_blocks = cdiv(max(lens), block_size) + 1
    k_cache, v_cache = caches(num_blocks, block_size, 2, 8, seed=block_size)
    in_order = torch.arange(num_blocks, dtype=torch.int32)
    for i, context_len in enumerate(lens):
        q, kv_head, scale = randn(8, seed=i), i % 2, 1.0 if i % 2 else None  # scale 1: a sharp softmax

        def run(end, q=q, kv_head=kv_head, scale=scale):
            return online_attention(q, k_cache, v_cache, end, kv_head, scale, kernel=ex.online_attention_kernel)

        what = (
            f"context_len {context_len} in blocks 0, 1, ..., block_size {block_size}, KV head {kv_head}, scale {scale}"
        )
        check_walk(run(context_len), run, what, q, k_cache, v_cache, in_order, context_len, kv_head, scale)


@pytest.mark.exercise("online_attention_kernel")
def test_online_attention_kernel_max_rises_every_step(ex):
    """Scores that grow along the sequence: the running max rises at every step, so every step rescales."""
    k_cache, v_cache = caches(6, 3, 1, 4, seed=7)
    q = torch.tensor([1.0, 0.0, 0.0, 0.0])
    k_cache[:, :, 0, 0] = torch.arange(18.0).reshape(6, 3) / 4  # the key at position pos has q . k = pos / 4

    def run(end):
        return online_attention(q, k_cache, v_cache, end, 0, 1.0, kernel=ex.online_attention_kernel)

    check_walk(run(17), run, "scores 0, 0.25, 0.5, ... (scale 1)", q, k_cache, v_cache, torch.arange(6), 17, 0, 1.0)


@pytest.mark.exercise("paged_attention_kernel")
@pytest.mark.parametrize("block_size,lens", ONE_SEQ, ids=ONE_SEQ_IDS)
def test_paged_attention_kernel_shuffled_tables(ex, block_size, lens):
    num_blocks = 2 * cdiv(max(lens), block_size) + 2  # blocks no sequence uses, too
    k_cache, v_cache = caches(num_blocks, block_size, 2, 6, seed=block_size + 1)
    for i, context_len in enumerate(lens):
        needed = cdiv(context_len, block_size)
        table = table_of(num_blocks, needed, needed + 2, seed=i)
        q, kv_head, scale = randn(6, seed=10 + i), (i + 1) % 2, 1.0 if i % 2 else None

        def run(end, q=q, kv_head=kv_head, scale=scale, table=table):
            return paged_attention(q, k_cache, v_cache, table, end, kv_head, scale, kernel=ex.paged_attention_kernel)

        what = f"context_len {context_len}, block_table {table.tolist()}, KV head {kv_head}, scale {scale}"
        check_walk(run(context_len), run, what, q, k_cache, v_cache, table, context_len, kv_head, scale)


GROUPS = [(2, 2), (4, 2), (4, 1), (8, 2)]  # (num_heads, num_kv_heads): groups 1, 2, 4, 4


@pytest.mark.exercise("gqa_attention_kernel")
@pytest.mark.parametrize("num_heads,num_kv_heads", GROUPS, ids=[f"{h}q-{k}kv" for h, k in GROUPS])
def test_gqa_attention_kernel_every_head(ex, num_heads, num_kv_heads):
    block_size, context_len, group = 3, 8, num_heads // num_kv_heads
    k_cache, v_cache = caches(8, block_size, num_kv_heads, 4, seed=num_heads * num_kv_heads)
    table = table_of(8, 3, 4, seed=num_heads)
    q = randn(num_heads, 4, seed=num_kv_heads)
    got = gqa_attention(q, k_cache, v_cache, table, context_len, kernel=ex.gqa_attention_kernel)
    for h in range(num_heads):
        likely = [
            (
                f"KV head {k}'s (query head {h} reads h // group = {h // group})",
                attend(q[h], k_cache, v_cache, table, 8, k),
            )
            for k in range(num_kv_heads)
            if k != h // group
        ]

        def run(end, h=h):
            return gqa_attention(q, k_cache, v_cache, table, end, kernel=ex.gqa_attention_kernel)[h]

        what = f"query head {h} of {num_heads} on {num_kv_heads} KV heads (group {group}), context_len {context_len}"
        check_walk(got[h], run, what, q[h], k_cache, v_cache, table, context_len, h // group, likely=likely)


# ---------------------------------------------------------------------------------------------
# Puzzle 6: the whole decode kernel, with the engine's signature

# (block_size, num_heads, num_kv_heads, head_dim, context_lens, dtype)
DECODE_CASES = [
    (1, 2, 2, 4, [1, 5, 3], torch.float32),
    (3, 4, 2, 5, [7, 1, 12, 4], torch.float32),
    (16, 4, 1, 8, [17, 40, 3], torch.float32),
    (3, 8, 2, 16, [5, 2], torch.bfloat16),
    (16, 2, 1, 6, [20, 33], torch.float16),
]


def decode_batch(block_size: int, num_heads: int, num_kv_heads: int, head_dim: int, lens: list[int], dtype, seed: int):
    """A decode step as the engine makes it: the pool's blocks handed out at random, each sequence its own."""
    needed = [cdiv(n, block_size) for n in lens]
    num_blocks = sum(needed) + 3
    ids = random.Random(seed).sample(range(num_blocks), sum(needed))
    rows = [ids[sum(needed[:i]) : sum(needed[: i + 1])] for i in range(len(lens))]
    width = max(needed) + 1
    tables = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)
    k_cache, v_cache = caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, seed)
    q = randn(len(lens), num_heads, head_dim, seed=seed, dtype=dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.exercise("paged_decode_kernel")
@pytest.mark.parametrize(
    "case", DECODE_CASES, ids=[f"bs{c[0]}-{c[1]}q{c[2]}kv-{len(c[4])}seqs-{str(c[5])[6:]}" for c in DECODE_CASES]
)
def test_paged_decode_kernel_against_reference(ex, case):
    block_size, num_heads, num_kv_heads, head_dim, lens, dtype = case
    q, k_cache, v_cache, tables, context_lens = decode_batch(*case, seed=block_size + num_heads)
    got = paged_decode_attention(q, k_cache, v_cache, tables, context_lens, kernel=ex.paged_decode_kernel)
    want = reference_decode(q, k_cache, v_cache, tables, context_lens)
    assert got.dtype == dtype, f"out must be in q's dtype {dtype}, got {got.dtype}"
    wrong = (~close(got, want)).any(dim=2).nonzero().tolist()  # programs (seq, head)
    if not wrong:
        return
    s, h = wrong[0]
    kv_head, others = h // (num_heads // num_kv_heads), [o for o in range(len(lens)) if o != s]
    likely = [
        (f"sequence {o}'s block table", attend(q[s, h], k_cache, v_cache, tables[o], lens[s], kv_head)) for o in others
    ]
    likely += [
        (f"sequence {o}'s context_len", attend(q[s, h], k_cache, v_cache, tables[s], lens[o], kv_head)) for o in others
    ]
    likely += [
        (
            f"KV head {k}'s (query head {h} reads h // group = {kv_head})",
            attend(q[s, h], k_cache, v_cache, tables[s], lens[s], k),
        )
        for k in range(num_kv_heads)
        if k != kv_head
    ]

    def run(end):  # the same batch, sequence s cut to its first end positions
        cut = context_lens.clone()
        cut[s] = end
        return paged_decode_attention(q, k_cache, v_cache, tables, cut, kernel=ex.paged_decode_kernel)[s, h]

    listed = ", ".join(str(tuple(p)) for p in wrong[:6]) + (" ..." if len(wrong) > 6 else "")
    what = (
        f"{len(lens)} sequences, context_lens {lens}, {num_heads} query heads on {num_kv_heads} KV heads, block_size "
        f"{block_size}, {str(dtype)[6:]}: {len(wrong)} of {len(lens) * num_heads} programs (seq, head) differ: "
        f"{listed}\nprogram {(s, h)}"
    )
    check_walk(got[s, h], run, what, q[s, h], k_cache, v_cache, tables[s], lens[s], kv_head, likely=likely)
    raise AssertionError(
        differs(f"{what}: differs from paged_decode_attention's {dtype} output", want[s, h], got[s, h])
    )


# ---------------------------------------------------------------------------------------------
# Puzzle 7: prefill, the causal mask

# (block_size, num_heads, num_kv_heads, head_dim, context_len, q_len, dtype): q_len == context_len
# is a prompt from position 0; q_len < context_len a later chunk, or a prompt after a prefix hit.
PREFILL_CASES = [
    (1, 2, 2, 4, 5, 5, torch.float32),
    (3, 4, 2, 5, 11, 11, torch.float32),
    (4, 4, 2, 8, 13, 6, torch.float32),  # starts mid-block: position 7 of block 1
    (16, 2, 1, 6, 40, 1, torch.float32),  # one token: the decode case
    (3, 8, 2, 16, 9, 4, torch.bfloat16),
]


def prefill_case(block_size, num_heads, num_kv_heads, head_dim, context_len, q_len, dtype):
    num_blocks = cdiv(context_len, block_size) + 3
    table = table_of(num_blocks, cdiv(context_len, block_size), cdiv(context_len, block_size) + 1, seed=context_len)
    k_cache, v_cache = caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, seed=block_size)
    q = randn(q_len, num_heads, head_dim, seed=q_len, dtype=dtype)
    return q, k_cache, v_cache, table


@pytest.mark.exercise("paged_prefill_kernel")
@pytest.mark.parametrize(
    "case", PREFILL_CASES, ids=[f"bs{c[0]}-{c[1]}q{c[2]}kv-ctx{c[4]}-new{c[5]}-{str(c[6])[6:]}" for c in PREFILL_CASES]
)
def test_paged_prefill_kernel_against_reference(ex, case):
    block_size, num_heads, num_kv_heads, head_dim, context_len, q_len, dtype = case
    q, k_cache, v_cache, table = prefill_case(*case)
    got = paged_prefill_attention(q, k_cache, v_cache, table, context_len, kernel=ex.paged_prefill_kernel)
    k, v = gather_kv(k_cache, table, context_len), gather_kv(v_cache, table, context_len)
    want = causal_attention(q, k, v)
    assert got.dtype == dtype, f"out must be in q's dtype {dtype}, got {got.dtype}"
    wrong = (~close(got, want)).any(dim=2).nonzero().tolist()  # programs (token, head)
    if not wrong:
        return
    i, h = wrong[0]
    group, start = num_heads // num_kv_heads, context_len - q_len
    token = q[i, h]

    def seen(n: int) -> torch.Tensor:  # token i's head h attending to the first n positions
        return attend(token, k_cache, v_cache, table, n, h // group)

    likely = [("no causal mask: every new token sees the whole context", seen(context_len))]
    if start:
        likely.append((f"the mask at position i = {i}, not context_len - q_len + i = {start + i}", seen(i + 1)))
    likely.append(("a mask that hides the token's own position", seen(start + i)) if start + i else ("", want[i, h]))
    what = (
        f"context_len {context_len}, q_len {q_len} (new tokens at positions {start}..{context_len - 1}), "
        f"{num_heads} query heads on {num_kv_heads} KV heads, block_size {block_size}, {str(dtype)[6:]}: "
        f"{len(wrong)} of {q_len * num_heads} programs (token, head) differ; program {(i, h)}"
    )
    raise AssertionError(differs(what, want[i, h], got[i, h], likely=[x for x in likely if x[0]]))
