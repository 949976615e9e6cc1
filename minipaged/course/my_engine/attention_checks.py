"""The checks of stages 3-4: slot mapping, the K/V write and paged attention, in torch and in Triton."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from minipaged.course.my_engine.base import CheckFailed

# ---------------------------------------------------------------- stage 3: slot mapping and attention in torch


def _random_tables(rng: random.Random, num_blocks: int, block_size: int, lens: list[int]) -> list[list[int]]:
    ids = rng.sample(range(num_blocks), num_blocks)
    tables, at = [], 0
    for n in lens:
        k = -(-n // block_size)
        tables.append(ids[at : at + k])
        at += k
    return tables


def _stage3_slots(m: ModuleType) -> None:
    from minipaged.kv.slot_mapping import build_slot_mapping

    for seed in range(10):
        rng = random.Random(seed)
        block_size = rng.choice([1, 4, 16])
        ends = [rng.randint(1, 40) for _ in range(rng.randint(1, 4))]
        starts = [rng.choice([0, e - 1, rng.randrange(e)]) for e in ends]
        tables = _random_tables(rng, 64, block_size, ends)
        want = build_slot_mapping(tables, starts, ends, block_size).tolist()
        got = m.slot_mapping(tables, starts, ends, block_size)
        got_list = got.tolist() if hasattr(got, "tolist") else list(got)
        if got_list != want or getattr(got, "dtype", None) is not None and str(got.dtype) != "torch.int64":
            hint = "slot = block_table[pos // block_size] * block_size + pos % block_size, positions start .. end - 1"
            if sorted(got_list) == sorted(want):
                hint = "pack the sequences in order, each one's positions in order"
            case = f"slot_mapping(block_tables={tables}, starts={starts}, ends={ends}, block_size={block_size})"
            raise CheckFailed(case + " (int64)", want, got_list, hint)


def _caches(
    seed: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def _stage3_store(m: ModuleType, store: Callable | None = None) -> None:
    import torch

    from minipaged.attention.reference import store_kvcache

    store = m.store_kv if store is None else store
    for seed, (block_size, heads, dim) in enumerate([(4, 2, 8), (16, 1, 32), (1, 3, 5)]):
        k_mine, v_mine = _caches(seed, 6, block_size, heads, dim)
        k_ref, v_ref = k_mine.clone(), v_mine.clone()
        gen = torch.Generator().manual_seed(100 + seed)
        n = 5
        key, value = torch.randn(n, heads, dim, generator=gen), torch.randn(n, heads, dim, generator=gen)
        slots = torch.tensor([3, 0, -1, 6 * block_size - 1, -1][:n], dtype=torch.int64)
        store(key, value, k_mine, v_mine, slots)
        store_kvcache(key, value, k_ref, v_ref, slots)
        case = f"store_kv of 5 tokens into slots {slots.tolist()}, block_size {block_size}, {heads} KV heads x {dim}"
        for what, got, want in (("k_cache", k_mine, k_ref), ("v_cache", v_mine, v_ref)):
            if not torch.equal(got, want):
                wrong = sorted({int(s) for s in (got != want).any(-1).any(-1).reshape(-1).nonzero().flatten()})
                hint = (
                    "slot -1 writes nothing (a padding token)"
                    if 6 * block_size - 1 in wrong and -1 in slots.tolist()
                    else ""
                )
                raise CheckFailed(
                    case + f": slots of {what} that differ",
                    [],
                    wrong,
                    hint or "view the cache as [num_slots, num_kv_heads, head_dim] and write row slot",
                )


def _attention_cases() -> list[tuple[str, int, int, int, int, list[int]]]:
    """(name, num_heads, num_kv_heads, head_dim, block_size, context_lens) for the attention checks."""
    return [
        ("MHA", 2, 2, 8, 4, [5, 9, 1]),
        ("GQA 4 on 2", 4, 2, 8, 4, [7, 13]),
        ("MQA 3 on 1", 3, 1, 5, 16, [20, 3]),
        ("GQA 8 on 2, blocks of 1", 8, 2, 4, 1, [6, 2, 4]),
    ]


def _decode_mistakes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> dict[str, torch.Tensor]:
    """What typical mistakes return, to name the one a wrong answer matches."""
    import torch

    from minipaged.attention.reference import causal_attention, gather_kv

    out: dict[str, Any] = {}
    heads, kv_heads = q.shape[1], k_cache.shape[2]

    def run(f: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
        res = torch.empty_like(q)
        for i, n in enumerate(lens.tolist()):
            res[i : i + 1] = f(i, n)
        return res

    def attend(qi: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: float) -> torch.Tensor:
        return causal_attention(qi, k, v, s)

    out["no scale (scores not multiplied by head_dim ** -0.5)"] = run(
        lambda i, n: attend(q[i : i + 1], gather_kv(k_cache, tables[i], n), gather_kv(v_cache, tables[i], n), 1.0)
    )
    if heads != kv_heads:
        modulo = torch.arange(heads) % kv_heads

        def by_modulo(i: int, n: int) -> torch.Tensor:
            k = gather_kv(k_cache, tables[i], n)[:, modulo]
            v = gather_kv(v_cache, tables[i], n)[:, modulo]
            return attend(q[i : i + 1], k, v, scale)

        out["query head h reads KV head h % num_kv_heads; it is h // (num_heads // num_kv_heads)"] = run(by_modulo)
    block_size = k_cache.shape[1]

    def whole_blocks(i: int, n: int) -> torch.Tensor:
        full = -(-n // block_size) * block_size
        return causal_attention(
            q[i : i + 1], gather_kv(k_cache, tables[i], full), gather_kv(v_cache, tables[i], full), scale
        )

    out["keys past context_len read (the last block's empty slots): stop at context_len"] = run(whole_blocks)
    out["the blocks read in pool order: read block_tables[i][j], not block j"] = run(
        lambda i, n: attend(
            q[i : i + 1],
            gather_kv(k_cache, torch.arange(tables.shape[1], dtype=torch.int32), n),
            gather_kv(v_cache, torch.arange(tables.shape[1], dtype=torch.int32), n),
            scale,
        )
    )
    return out


def _padded(tables: list[list[int]]) -> torch.Tensor:
    import torch

    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)


def _stage3_decode(m: ModuleType, attention: Callable | None = None) -> None:
    import torch

    from minipaged.attention.reference import paged_decode_attention

    attention = m.paged_decode_attention if attention is None else attention
    for seed, (name, heads, kv_heads, dim, block_size, lens) in enumerate(_attention_cases()):
        rng = random.Random(seed)
        num_blocks = 3 + sum(-(-n // block_size) for n in lens)
        k_cache, v_cache = _caches(seed, num_blocks, block_size, kv_heads, dim)
        tables = _padded(_random_tables(rng, num_blocks, block_size, lens))
        context_lens = torch.tensor(lens, dtype=torch.int32)
        q = torch.randn(len(lens), heads, dim, generator=torch.Generator().manual_seed(seed))
        scale = dim**-0.5
        want = paged_decode_attention(q, k_cache, v_cache, tables, context_lens, scale)
        got = attention(q, k_cache, v_cache, tables, context_lens, scale)
        if got.shape != want.shape or not torch.allclose(got.float(), want, atol=1e-5, rtol=1e-4):
            hint = ""
            if got.shape == want.shape:
                for mistake, value in _decode_mistakes(q, k_cache, v_cache, tables, context_lens, scale).items():
                    if torch.allclose(got.float(), value, atol=1e-5, rtol=1e-4):
                        hint = mistake
                        break
            case = (
                f"paged_decode_attention, {name}: {heads} query heads, {kv_heads} KV heads, head_dim {dim}, "
                f"block_size {block_size}, context_lens {lens}, block_tables {tables.tolist()}"
            )
            shown_got = got.flatten()[:4].tolist() if got.shape == want.shape else f"shape {tuple(got.shape)}"
            raise CheckFailed(
                case,
                [round(x, 4) for x in want.flatten()[:4].tolist()],
                shown_got if isinstance(shown_got, str) else [round(x, 4) for x in shown_got],
                hint,
            )


def _stage3_prefill(m: ModuleType) -> None:
    import torch

    from minipaged.attention.reference import paged_prefill_attention

    for seed, (name, heads, kv_heads, dim, block_size, lens) in enumerate(_attention_cases()):
        rng = random.Random(seed)
        num_blocks = 3 + sum(-(-n // block_size) for n in lens)
        k_cache, v_cache = _caches(seed, num_blocks, block_size, kv_heads, dim)
        tables = _padded(_random_tables(rng, num_blocks, block_size, lens))
        q_lens = [max(1, n - rng.randrange(n)) for n in lens]  # a chunk, or the rest after a prefix hit
        cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        context_lens = torch.tensor(lens, dtype=torch.int32)
        q = torch.randn(sum(q_lens), heads, dim, generator=torch.Generator().manual_seed(seed))
        want = paged_prefill_attention(q, k_cache, v_cache, tables, cu, context_lens, dim**-0.5)
        got = m.paged_prefill_attention(q, k_cache, v_cache, tables, cu, context_lens, dim**-0.5)
        if got.shape != want.shape or not torch.allclose(got.float(), want, atol=1e-5, rtol=1e-4):
            hint = (
                "query i of a sequence sits at position context_len - q_len + i and sees keys 0 .. that position "
                "(a chunk or the rest of a prompt after a prefix hit does not start at 0)"
            )
            case = f"paged_prefill_attention, {name}: q_lens {q_lens}, context_lens {lens}, block_size {block_size}"
            rows = [
                r
                for r in range(want.shape[0])
                if got.shape != want.shape or not torch.allclose(got[r].float(), want[r], atol=1e-5, rtol=1e-4)
            ]
            raise CheckFailed(case + ": the rows of q that differ", [], rows[:12], hint)


# ---------------------------------------------------------------- stage 4: the Triton kernels


def _stage4_store(m: ModuleType) -> None:
    _stage3_store(m, store=m.store_kv)


def _stage4_decode(m: ModuleType) -> None:
    _stage3_decode(m, attention=m.paged_decode_attention)
