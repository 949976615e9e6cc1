"""The checks of stage 5: the KV door (``KVCacheManager``) and the scheduler."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from minipaged.course.my_engine.base import CheckFailed, free_queue_ids, outcome

# ---------------------------------------------------------------- stage 5: the KV door and the scheduler

# The workload of the scheduler checks: (name, prompt length, max_tokens), arriving together.
WORKLOAD = [("R0", 13, 6), ("R1", 25, 10), ("R2", 20, 4), ("R3", 21, 12), ("R4", 9, 8), ("R5", 30, 5)]
# (block_size, num_blocks, max_num_seqs, max_num_batched_tokens) -> the steps the reference scheduler takes
# (scheduled {name: tokens} in order, preempted), as a check of the shipped solution makes sure.
SCENARIOS: dict[str, tuple[tuple[int, int, int, int], list[tuple[list[tuple[str, int]], list[str]]]]] = {}


def drive(m: ModuleType, settings: tuple[int, int, int, int], steps: int = 200) -> list[tuple[list, list]]:
    """Run the learner's ``Scheduler`` and ``KVCacheManager`` over :data:`WORKLOAD` (every sampled token is 7)."""
    from minipaged.kv.block_pool import BlockPool

    block_size, num_blocks, max_seqs, budget = settings
    kv = m.KVCacheManager(BlockPool(num_blocks), block_size)
    sched = m.Scheduler(kv, max_seqs, budget)
    for name, prompt_len, max_tokens in WORKLOAD:
        sched.add_request(m.Request(name, list(range(prompt_len)), max_tokens))
    trace: list[tuple[list, list]] = []
    for _ in range(steps):
        if not sched.waiting and not sched.running:
            break
        out = sched.schedule()
        trace.append((list(out.num_scheduled_tokens.items()), list(out.preempted)))
        sched.update_from_output(out, {name: 7 for name in out.num_scheduled_tokens})
    return trace


def _stage5_door(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool

    pool = BlockPool(6)
    kv = m.KVCacheManager(pool, 4)
    r = m.Request("A", list(range(10)), 4)
    got = kv.allocate_slots(r, 10)
    if got is None or [b.block_id for b in got] != [0, 1, 2]:
        raise CheckFailed(
            "KVCacheManager(BlockPool(6), block_size 4): allocate_slots(A with 10 prompt tokens, 10)",
            [0, 1, 2],
            got and [b.block_id for b in got],
            "cdiv(10, 4) = 3 blocks",
        )
    r.num_computed_tokens = 10
    r.output_token_ids.append(7)
    want: list[int] = []
    for _ in range(2):
        got = kv.allocate_slots(r, 1)
        if got is None or [b.block_id for b in got] != want:
            raise CheckFailed(
                f"A holds {r.num_computed_tokens} tokens in 3 blocks: allocate_slots(A, 1)",
                want,
                got and [b.block_id for b in got],
                "a new block only when the last one is full",
            )
        r.num_computed_tokens += 1
        r.output_token_ids.append(7)
    got = kv.allocate_slots(r, 1)
    if got is None or [b.block_id for b in got] != [3]:
        raise CheckFailed(
            "A holds 12 tokens in 3 full blocks: allocate_slots(A, 1)",
            [3],
            got and [b.block_id for b in got],
            "the 13th token needs a 4th block",
        )
    b = m.Request("B", list(range(9)), 4)
    if kv.allocate_slots(b, 9) is not None or pool.num_free_blocks != 2:
        raise CheckFailed(
            "2 blocks free: allocate_slots(B with 9 tokens, 9)",
            ("None", "2 blocks still free"),
            "blocks taken",
            "not enough free blocks: return None and take nothing",
        )
    kv.free(r)
    want = [4, 5, 3, 2, 1, 0]
    if free_queue_ids(pool) != want:
        raise CheckFailed(
            "free(A) after A held [0, 1, 2, 3]: the pool's free queue",
            want,
            free_queue_ids(pool),
            "give the request's blocks to pool.free in logical order (it frees them tail first)",
        )
    _door_with_free_hits(m, pool, kv)


def _door_with_free_hits(m: ModuleType, pool: Any, kv: Any) -> None:
    """Prefix hits that wait in the free queue (``ref_cnt`` 0) are taken from it: they count."""
    kv.allocate_slots(m.Request("D", list(range(4)), 4), 4)  # block 4: 5 left, among them 0 and 1
    hits = [pool.blocks[0], pool.blocks[1]]
    c = m.Request("C", list(range(24)), 4)
    got = outcome(lambda: kv.allocate_slots(c, 16, hits), (Exception,), "an error")
    if got is not None or pool.num_free_blocks != 5:
        raise CheckFailed(
            "5 blocks free, two of them C's prefix hits (ref_cnt 0): allocate_slots(C with 24 tokens, 16, hits)",
            ("None", "5 blocks still free"),
            (got if isinstance(got, str) else "blocks taken", f"{pool.num_free_blocks} free"),
            "a hit with ref_cnt 0 leaves the free queue when touched: it needs a free block too (4 + 2 > 5)",
        )
    got = kv.allocate_slots(c, 12, hits)
    if got is None or len(got) != 3 or [b.ref_cnt for b in hits] != [1, 1] or pool.num_free_blocks != 0:
        raise CheckFailed(
            "5 blocks free, two of them C's prefix hits: allocate_slots(C, 12, hits), room for 8 + 12 tokens",
            ("3 new blocks", "hits ref_cnt [1, 1]", "0 free"),
            (got and len(got), [b.ref_cnt for b in hits], pool.num_free_blocks),
            "pool.touch each hit, then allocate the rest: 2 hits + 3 new = cdiv(20, 4)",
        )


def _schedule_hint(want: tuple, got: tuple, settings: tuple[int, int, int, int]) -> str:
    """The likely mistake behind a step that differs."""
    (w_sched, w_pre), (g_sched, g_pre) = want, got
    max_seqs, budget = settings[2], settings[3]
    rules = [
        (w_pre and g_pre and g_pre != w_pre, "preempt the NEWEST running request (the last of running) until it fits"),
        (w_pre and not g_pre, "when allocate_slots returns None, preempt the newest running request and try again"),
        (w_pre and g_pre == w_pre and len(g_sched) > len(w_sched), "a step that preempted admits nobody waiting"),
        (
            [n for n, _ in g_sched] != [n for n, _ in w_sched] and sorted(g_sched) == sorted(w_sched),
            "running requests first, oldest first; then waiting ones, front first",
        ),
        (
            sum(n for _, n in g_sched) > budget,
            "a step computes at most max_num_batched_tokens tokens: a long prompt goes in chunks",
        ),
        (len(g_sched) > max_seqs, "at most max_num_seqs requests run"),
        (
            len(g_sched) < len(w_sched),
            "admit waiting requests, front first, while the budget, max_num_seqs and free blocks allow",
        ),
    ]
    return next((hint for applies, hint in rules if applies), "")


def _compare_trace(m: ModuleType, key: str) -> None:
    settings, want = SCENARIOS[key]
    got = drive(m, settings)
    block_size, num_blocks, max_seqs, budget = settings
    where = (
        f"{len(WORKLOAD)} requests (name, prompt, max_tokens) {WORKLOAD}, block_size {block_size}, "
        f"{num_blocks} blocks, max_num_seqs {max_seqs}, max_num_batched_tokens {budget}"
    )
    for step, (w, g) in enumerate(zip(want, got)):
        if w != g:
            raise CheckFailed(f"{where}: step {step} (scheduled, preempted)", w, g, _schedule_hint(w, g, settings))
    if len(got) != len(want):
        raise CheckFailed(
            f"{where}: steps until every request finished",
            len(want),
            len(got),
            "each step must move every scheduled request on (update_from_output is given)",
        )


def _stage5_schedule(m: ModuleType) -> None:
    _compare_trace(m, "whole prompts")


def _stage5_chunked(m: ModuleType) -> None:
    _compare_trace(m, "chunked prefill")


SCENARIOS["whole prompts"] = (
    (8, 14, 4, 512),
    [
        ([("R0", 13), ("R1", 25), ("R2", 20), ("R3", 21)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 1)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 1)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 1)], []),
        ([("R0", 1), ("R1", 1), ("R3", 1), ("R4", 9)], []),
        ([("R0", 1), ("R1", 1), ("R3", 1), ("R4", 1)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 30)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 1)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1)], ["R5"]),
        ([("R1", 1), ("R3", 1), ("R4", 1)], []),
        ([("R3", 1), ("R4", 1), ("R5", 32)], []),
        ([("R3", 1), ("R4", 1), ("R5", 1)], []),
        ([("R5", 1)], []),
    ],
)
SCENARIOS["chunked prefill"] = (
    (8, 14, 4, 16),
    [
        ([("R0", 13), ("R1", 3)], []),
        ([("R0", 1), ("R1", 15)], []),
        ([("R0", 1), ("R1", 7), ("R2", 8)], []),
        ([("R0", 1), ("R1", 1), ("R2", 12), ("R3", 2)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 13)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 6)], []),
        ([("R1", 1), ("R2", 1), ("R3", 1), ("R4", 9)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 13)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 13)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 4)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1)], ["R5"]),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 13)], []),
        ([("R3", 1), ("R4", 1), ("R5", 14)], []),
        ([("R3", 1), ("R4", 1), ("R5", 4)], []),
        ([("R3", 1), ("R5", 1)], []),
        ([("R3", 1), ("R5", 1)], []),
        ([("R3", 1), ("R5", 1)], []),
    ],
)
