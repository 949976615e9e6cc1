"""The checks of stages 0-2: the contiguous cache, the block pool, block tables."""

from __future__ import annotations

import functools
import random
from types import ModuleType
from typing import Any

from minipaged.course.my_engine.base import CheckFailed, free_queue_ids, must_raise, outcome

# ---------------------------------------------------------------- stage 0: the contiguous cache


def _stage0_bytes(m: ModuleType) -> None:
    cases = [
        ((2, 2, 32, 4), "the embedded model, fp32"),
        ((40, 40, 128, 2), "OPT-13B, fp16"),
        ((30, 3, 64, 2), "SmolLM2-135M, bf16 (GQA)"),
        ((4, 1, 16, 1), "one KV head (MQA), 1 byte"),
    ]
    for (layers, kv_heads, head_dim, nbytes), what in cases:
        want = 2 * layers * kv_heads * head_dim * nbytes
        got = m.kv_bytes_per_token(layers, kv_heads, head_dim, nbytes)
        if got != want:
            hint = ""
            if got == want // 2:
                hint = "a token stores a key AND a value: the factor 2"
            elif got == want // nbytes:
                hint = "count bytes, not numbers: multiply by dtype_bytes"
            elif got == want // layers:
                hint = "every layer keeps its own K/V: multiply by num_layers"
            raise CheckFailed(f"kv_bytes_per_token{(layers, kv_heads, head_dim, nbytes)} ({what})", want, got, hint)


def _stage0_reserve(m: ModuleType, mine: Any, ref: Any, seq: int, case: str) -> object:
    from minipaged.kv.contiguous import ArenaFullError

    want = outcome(lambda: ref.reserve(seq, mine.max_seq_len), (ArenaFullError,), "CacheFullError")
    got = outcome(lambda: mine.reserve(seq), (m.CacheFullError,), "CacheFullError")
    if got != want:
        hint = ""
        if want == "CacheFullError":
            hint = "when no hole holds max_seq_len slots, raise CacheFullError"
        elif got == "CacheFullError" or (isinstance(got, int) and isinstance(want, int) and got > want):
            hint = "first fit: reuse the first hole big enough, counting from slot 0 (freed buffers leave holes)"
        raise CheckFailed(case, want, got, hint)
    return want


def _stage0_cache(m: ModuleType) -> None:
    from minipaged.kv.contiguous import FirstFitArena

    for seed in range(6):
        rng = random.Random(seed)
        num_slots, max_len = rng.choice([(64, 16), (100, 24), (96, 32)])
        mine, ref = m.ContiguousCache(num_slots, max_len), FirstFitArena(num_slots)
        live: list[int] = []
        history: list[str] = []
        for step in range(40):
            if live and (rng.random() < 0.4 or len(live) * max_len + max_len > num_slots):
                seq = live.pop(rng.randrange(len(live)))
                mine.free(seq)
                ref.free(seq)
                history.append(f"free({seq})")
                continue
            history.append(f"reserve({step})")
            case = f"ContiguousCache({num_slots}, {max_len}): " + ", ".join(history[-6:])
            start = _stage0_reserve(m, mine, ref, step, case)
            if not isinstance(start, int):
                continue
            live.append(step)
            pos = rng.randrange(max_len)
            if mine.slot(step, pos) != start + pos:
                raise CheckFailed(
                    f"{case}; slot({step}, {pos})", start + pos, mine.slot(step, pos), "slot = start + pos"
                )
        if live:
            must_raise(
                functools.partial(mine.slot, live[0], max_len),
                (IndexError,),
                f"slot({live[0]}, {max_len}) with max_seq_len {max_len}",
                "a position past the buffer must raise IndexError, not write into the next one",
            )


def _stage0_waste(m: ModuleType) -> None:
    cache = m.ContiguousCache(100, 20)
    for seq in ("a", "b", "c"):
        cache.reserve(seq)
    tokens = {"a": 5, "b": 20, "c": 0}
    want = 1 - 25 / 60
    got = cache.waste(tokens)
    if abs(got - want) > 1e-9:
        hint = (
            "the share of the RESERVED slots (3 x 20), not of all num_slots" if abs(got - (1 - 25 / 100)) < 1e-9 else ""
        )
        raise CheckFailed("3 buffers of 20 holding 5, 20 and 0 tokens: waste(...)", want, got, hint)


# ---------------------------------------------------------------- stage 1: the block pool


def _pool_ops(rng: random.Random, num_blocks: int) -> list[tuple]:
    """A random script of allocate / share / free on named holders."""
    ops: list[tuple] = []
    holders: dict[str, int] = {}
    free = num_blocks
    for i in range(30):
        r = rng.random()
        if holders and r < 0.35:
            name = rng.choice(sorted(holders))
            ops.append(("free", name))
            free += holders.pop(name)  # an upper bound: shared blocks stay taken
        elif holders and r < 0.5:
            name = rng.choice(sorted(holders))
            ops.append(("share", name, f"s{i}"))
            holders[f"s{i}"] = 0
        else:
            n = rng.randint(1, max(1, min(4, free)))
            ops.append(("allocate", f"r{i}", n))
            holders[f"r{i}"] = n
            free -= n
    return ops


def _stage1_step(m: ModuleType, pools: tuple[Any, Any], held: tuple[dict, dict], op: tuple, done: list[str]) -> None:
    """One operation of the script on the learner's pool and the package's, the learner's answer checked."""
    from minipaged.kv.block_pool import NoFreeBlocksError

    (mine, ref), (held_mine, held_ref), (kind, name) = pools, held, op[:2]
    if kind == "allocate":
        done.append(f"{name} = allocate({op[2]})")
        want = outcome(lambda: ref.allocate(op[2]), (NoFreeBlocksError,), "NoFreeBlocksError")
        got = outcome(lambda: mine.allocate(op[2]), (m.NoFreeBlocksError,), "NoFreeBlocksError")
        ids = [[b.block_id for b in x] if isinstance(x, list) else x for x in (want, got)]
        if ids[0] != ids[1]:
            hint = "hand out the FRONT of the free queue (popleft), the block freed longest ago"
            if want == "NoFreeBlocksError":
                hint = "asking for more blocks than are free raises NoFreeBlocksError and takes nothing"
            raise CheckFailed(f"BlockPool({len(ref.blocks)}): " + "; ".join(done[-5:]), ids[0], ids[1], hint)
        if isinstance(want, list):
            held_ref[name], held_mine[name] = want, got
    elif kind == "share":
        done.append(f"{op[2]} = share({name})")
        for pool, holding in ((ref, held_ref), (mine, held_mine)):
            for b in holding[name]:
                pool.share(b)
            holding[op[2]] = list(holding[name])
    else:
        done.append(f"free({name})")
        ref.free(held_ref.pop(name))
        mine.free(held_mine.pop(name))


def _stage1_same(mine: Any, ref: Any, case: str) -> None:
    want_cnt, got_cnt = [b.ref_cnt for b in ref.blocks], [b.ref_cnt for b in mine.blocks]
    if got_cnt != want_cnt:
        hint = "share adds 1 to ref_cnt; free takes 1 away; allocate sets it to 1"
        raise CheckFailed(case + ": ref_cnt of blocks 0..", want_cnt, got_cnt, hint)
    if free_queue_ids(mine) != free_queue_ids(ref):
        hint = "a block goes back to the free queue only when its ref_cnt reaches 0"
        if sorted(free_queue_ids(mine)) == sorted(free_queue_ids(ref)):
            hint = "free walks a table TAIL FIRST (reversed) and appends each freed block at the back"
        raise CheckFailed(case + ": free queue, front first", free_queue_ids(ref), free_queue_ids(mine), hint)


def _stage1_pool(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool

    for seed in range(8):
        rng = random.Random(seed)
        num_blocks = rng.choice([6, 10, 12])
        pools = (m.BlockPool(num_blocks), BlockPool(num_blocks))
        held: tuple[dict, dict] = ({}, {})
        done: list[str] = []
        for op in _pool_ops(rng, num_blocks):
            if op[0] != "allocate" and op[1] not in held[1]:  # its allocation was refused
                continue
            _stage1_step(m, pools, held, op, done)
            _stage1_same(*pools, f"BlockPool({num_blocks}): " + "; ".join(done[-5:]))
    pool = m.BlockPool(4)
    blocks = pool.allocate(2)
    pool.free(blocks)
    must_raise(
        lambda: pool.free(blocks[:1]),
        (ValueError, RuntimeError),
        "allocate(2), free them, free the first again",
        "freeing a block whose ref_cnt is 0 is a bug in the caller: raise ValueError",
    )


def _stage1_touch(m: ModuleType) -> None:
    pool = m.BlockPool(6)
    a = pool.allocate(3)
    pool.free(a)  # queue: 3 4 5 2 1 0
    pool.touch(a[1])  # a hit on a free block: it leaves the middle of the queue
    want = ([3, 4, 5, 2, 0], [0, 1, 0, 0, 0, 0])
    got = (free_queue_ids(pool), [b.ref_cnt for b in pool.blocks])
    if got != want:
        hint = "touch takes a free block OUT of the free queue (wherever it is) and sets ref_cnt 1"
        raise CheckFailed(
            "BlockPool(6): a = allocate(3); free(a); touch(a[1]) -> (free queue, ref_cnt)", want, got, hint
        )
    pool.touch(a[1])
    if a[1].ref_cnt != 2:
        raise CheckFailed("touch on a block in use", 2, a[1].ref_cnt, "a block in use just gets one more reference")


# ---------------------------------------------------------------- stage 2: block tables


def _stage2_table(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool
    from minipaged.kv.block_table import BlockTable

    for seed in range(6):
        rng = random.Random(seed)
        block_size = rng.choice([1, 4, 16])
        pool_mine, pool_ref = BlockPool(40), BlockPool(40)
        for p in (pool_mine, pool_ref):  # the same shuffled free queue in both
            blocks = p.allocate(40)
            for b in random.Random(seed).sample(blocks, 40):
                p.free([b])
        mine, ref = m.BlockTable(block_size), BlockTable(block_size)
        grown = []
        for _ in range(8):
            n = rng.choice([1, 1, 1, 3, block_size, 2 * block_size + 1])
            if ref.num_tokens + n > 40 * block_size // 5:
                break
            grown.append(n)
            want, got = ref.append_tokens(n, pool_ref), mine.append_tokens(n, pool_mine)
            case = f"BlockTable({block_size}), append_tokens of {grown}"
            want_state, got_state = (want, ref.block_ids, ref.num_tokens), (got, mine.block_ids, mine.num_tokens)
            if got_state != want_state:
                hint = "take a block only when the tokens do not fit the last one: "
                hint += "cdiv(num_tokens + n, block_size) - len(block_ids) new blocks"
                raise CheckFailed(case + ": (new ids, block_ids, num_tokens)", want_state, got_state, hint)
        _stage2_positions(mine, ref, f"BlockTable({block_size}), append_tokens of {grown}")


def _stage2_positions(mine: Any, ref: Any, case: str) -> None:
    for pos in range(ref.num_tokens):
        if mine.physical(pos) != ref.physical(pos):
            hint = "logical block pos // block_size -> block_ids[...], offset pos % block_size"
            raise CheckFailed(f"{case}: physical({pos})", ref.physical(pos), mine.physical(pos), hint)
    must_raise(
        lambda: mine.physical(ref.num_tokens),
        (IndexError,),
        f"{case}: physical({ref.num_tokens}) (past the last token)",
        "a position the table holds no token for must raise IndexError",
    )


def _stage2_free(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool
    from minipaged.kv.block_table import BlockTable

    pool_mine, pool_ref = BlockPool(8), BlockPool(8)
    mine, ref = m.BlockTable(4), BlockTable(4)
    mine.append_tokens(10, pool_mine)
    ref.append_tokens(10, pool_ref)
    mine.free(pool_mine)
    ref.free(pool_ref)
    want, got = (
        (free_queue_ids(pool_ref), ref.block_ids, ref.num_tokens),
        (free_queue_ids(pool_mine), mine.block_ids, mine.num_tokens),
    )
    if got != want:
        raise CheckFailed(
            "BlockTable(4) of 10 tokens, free(pool): (free queue, block_ids, num_tokens)",
            want,
            got,
            "give every block back to the pool (pool.free takes blocks, tail first) and empty the table",
        )
