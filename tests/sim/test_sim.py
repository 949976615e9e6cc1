"""Synthetic traces and the contiguous-versus-paged memory replay: per-step series and step-by-step states."""

from __future__ import annotations

import statistics

import pytest

from minipaged.kv.contiguous import FirstFitArena
from minipaged.sim import (
    ContiguousReplay,
    PagedReplay,
    TraceRequest,
    next_power_of_two,
    replay,
    replay_steps,
    simulate_contiguous_vs_paged,
    synthetic_trace,
    token_ids_for,
)


def test_trace_is_determined_by_its_seed():
    assert synthetic_trace(50, seed=3) == synthetic_trace(50, seed=3)
    assert synthetic_trace(50, seed=3) != synthetic_trace(50, seed=4)


def test_trace_lengths_are_long_tailed_and_bounded():
    trace = synthetic_trace(2000, seed=0, mean_prompt=200, mean_output=100, max_len=1024, arrival_rate=0.5)
    prompts = [r.prompt_len for r in trace]
    assert all(r.prompt_len >= 1 and r.output_len >= 1 and r.total_len <= 1024 for r in trace)
    assert statistics.median(prompts) < 0.8 * statistics.mean(prompts)  # a long right tail
    assert max(prompts) > 4 * statistics.median(prompts)
    assert 170 < statistics.mean(prompts) < 230  # the clipped lognormal keeps roughly its mean
    arrivals = [r.arrival for r in trace]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0
    assert 3600 < arrivals[-1] < 4400  # 2000 arrivals at 0.5 per step take ~4000 steps
    assert [r.request_id for r in trace] == list(range(2000))


def test_shared_prefixes_and_token_ids():
    trace = synthetic_trace(30, seed=1, mean_prompt=20, shared_prefix_len=32, num_prefixes=3)
    assert {r.prefix_id for r in trace} == {0, 1, 2}
    assert all(r.prefix_len == 32 and r.prompt_len > 32 for r in trace)
    ids = {r.request_id: token_ids_for(r, vocab_size=50, seed=7) for r in trace}
    assert all(len(ids[r.request_id]) == r.prompt_len for r in trace)
    assert all(0 <= t < 50 for toks in ids.values() for t in toks)
    by_prefix: dict[int, list[list[int]]] = {}
    for r in trace:
        by_prefix.setdefault(r.prefix_id, []).append(ids[r.request_id])
    heads = {p: {tuple(toks[:32]) for toks in group} for p, group in by_prefix.items()}
    assert all(len(h) == 1 for h in heads.values())  # one prefix per prefix_id
    assert len(set.union(*heads.values())) == 3  # and different prefix_ids differ
    tails = [tuple(toks[32:]) for toks in ids.values()]
    assert len(set(tails)) == len(tails)  # the rest of each prompt is its own
    assert token_ids_for(trace[0], 50, seed=7) == ids[0]
    assert token_ids_for(trace[0], 50, seed=8) != ids[0]


def test_no_prefix_means_independent_prompts():
    a, b = TraceRequest(0, 0, 10, 5), TraceRequest(1, 0, 10, 5)
    assert token_ids_for(a, 1000, seed=0) != token_ids_for(b, 1000, seed=0)


def test_prefix_arguments_must_agree():
    with pytest.raises(ValueError, match="both be 0 or both be positive"):
        synthetic_trace(5, seed=0, shared_prefix_len=16)
    with pytest.raises(ValueError, match="leaves no room"):
        synthetic_trace(5, seed=0, shared_prefix_len=64, num_prefixes=1, max_len=64)


def test_replay_by_hand():
    """64 slots, max_seq_len 32: contiguous fits 2 buffers, paged (8 blocks of 8) fits all 3 requests."""
    trace = [TraceRequest(i, 0, prompt_len=4, output_len=2) for i in range(3)]
    res = simulate_contiguous_vs_paged(trace, num_slots=64, block_size=8, max_seq_len=32)
    c, p = res["contiguous"], res["paged"]
    # Admitted at step 0 with 4 tokens, 5 and 6 tokens at steps 1 and 2, released at step 3.
    assert res["time"] == list(range(7))
    assert p["running"] == [3, 3, 3, 0, 0, 0, 0]
    assert p["used_slots"] == [12, 15, 18, 0, 0, 0, 0]
    assert p["allocated_slots"] == [24, 24, 24, 0, 0, 0, 0]
    # The third request waits for a whole 32-slot buffer to come free.
    assert c["running"] == [2, 2, 2, 1, 1, 1, 0]
    assert c["queue_len"] == [1, 1, 1, 0, 0, 0, 0]
    assert c["admitted"] == [2, 2, 2, 3, 3, 3, 3]
    assert c["used_slots"] == [8, 10, 12, 4, 5, 6, 0]
    assert c["allocated_slots"] == [64, 64, 64, 32, 32, 32, 0]
    assert c["external_fragmentation"][3] == 0.0  # one hole of 32
    assert res["totals"]["contiguous"]["steps"] == 6 and res["totals"]["paged"]["steps"] == 3
    exact = simulate_contiguous_vs_paged(trace, num_slots=64, block_size=8, max_seq_len=32, reserve="exact")
    assert exact["contiguous"]["allocated_slots"][:4] == [18, 18, 18, 0]


@pytest.fixture(scope="module")
def realistic():
    trace = synthetic_trace(200, seed=0, mean_prompt=256, mean_output=128, max_len=2048, arrival_rate=0.5)
    return trace, simulate_contiguous_vs_paged(trace, num_slots=16384, block_size=16, max_seq_len=2048)


def test_paged_admits_more_with_the_same_memory(realistic):
    _, res = realistic
    c, p = res["totals"]["contiguous"], res["totals"]["paged"]
    assert p["peak_running"] > 3 * c["peak_running"]  # 8 buffers of 2048 vs blocks on demand
    assert p["mean_running"] > 2 * c["mean_running"]
    assert p["steps"] < 0.5 * c["steps"]
    assert c["token_utilization"] < 0.4  # the paper's 20.4-38.2% for prior systems
    assert p["token_utilization"] > 0.9  # only last blocks are partly empty


def test_replay_leaks_nothing_and_stays_in_bounds(realistic):
    trace, res = realistic
    for name in ("contiguous", "paged"):
        series, totals = res[name], res["totals"][name]
        assert all(len(values) == len(res["time"]) for values in series.values())
        assert totals["finished"] == len(trace) and totals["final_allocated_slots"] == 0
        assert series["admitted"][-1] == len(trace) and series["queue_len"][-1] == 0
        for used, allocated in zip(series["used_slots"], series["allocated_slots"], strict=True):
            assert 0 <= used <= allocated <= 16384
        assert all(0.0 <= f < 1.0 for f in series["external_fragmentation"])
    assert res["totals"]["contiguous"]["preemptions"] == 0


def test_replay_is_deterministic_and_validates(realistic):
    trace, res = realistic
    again = simulate_contiguous_vs_paged(trace, num_slots=16384, block_size=16, max_seq_len=2048)
    assert again == res
    with pytest.raises(ValueError, match="exceed max_seq_len 1024"):
        simulate_contiguous_vs_paged(trace, num_slots=16384, block_size=16, max_seq_len=1024)
    with pytest.raises(ValueError, match="reserve must be"):
        simulate_contiguous_vs_paged(trace, num_slots=16384, block_size=16, max_seq_len=2048, reserve="min")


# Three requests arriving together: (id, arrival, prompt, output).
HAND_TRACE = [TraceRequest(0, 0, 1, 2), TraceRequest(1, 0, 1, 3), TraceRequest(2, 0, 2, 3)]


def test_contiguous_steps_by_hand():
    """10 slots, exact sizes 3, 4 and 5: when 0 finishes, 6 slots are free but the largest hole holds 3."""
    states = list(replay_steps(HAND_TRACE, ContiguousReplay(num_slots=10, max_seq_len=5, reserve="exact")))
    assert [s.step for s in states] == list(range(9))
    first, hole, last = states[0], states[3], states[-1]
    assert first.running == (0, 1) and first.waiting == (2,) and first.tokens == {0: 1, 1: 1}
    assert first.arena.reservations() == {0: (0, 3), 1: (3, 4)}
    assert not first.held_back  # 3 slots free: not enough for 5 in total either
    assert [s.tokens for s in states[1:3]] == [{0: 2, 1: 2}, {0: 3, 1: 3}]
    # Step 3: request 0 is done; holes (0, 3) and (7, 3) add up to 6 >= 5, yet 2 must wait.
    assert hole.running == (1,) and hole.waiting == (2,) and hole.finished == 1
    assert hole.arena.holes() == [(0, 3), (7, 3)] and hole.arena.external_fragmentation == 0.5
    assert hole.held_back and [s.step for s in states if s.held_back] == [3]
    assert states[4].arena.reservations() == {2: (0, 5)} and states[4].tokens == {2: 2}
    assert last.running == last.waiting == () and last.arena.reservations() == {} and last.finished == 3


class _TopFitArena(FirstFitArena):
    """Reserves at the top of the highest hole that fits (for the test: any other placement rule)."""

    def reserve(self, owner, size: int) -> int:
        fitting = [(start, hole) for start, hole in self.holes() if hole >= size]
        if not fitting:
            return super().reserve(owner, size)  # raises ArenaFullError
        start, hole = fitting[-1]
        self._spans[owner] = (start + hole - size, size)
        return start + hole - size


def test_contiguous_replay_takes_another_arena():
    states = list(replay_steps(HAND_TRACE, ContiguousReplay(10, 5, reserve="exact", arena_type=_TopFitArena)))
    assert type(states[0].arena) is _TopFitArena
    assert states[0].arena.reservations() == {1: (3, 4), 0: (7, 3)}
    # 0 leaves the hole (7, 3) beside (0, 3): the same wait as with first fit, but 2 then goes to the top.
    assert [s.step for s in states if s.held_back] == [3] and states[4].arena.reservations() == {2: (5, 5)}


def test_paged_steps_by_hand():
    """5 blocks of 2 slots: at step 2 request 1 needs a block, so the newest (2) is preempted, tail first."""
    system = PagedReplay(num_blocks=5, block_size=2)
    states = list(replay_steps(HAND_TRACE, system))
    expected = [  # running, waiting, block tables, free queue front first, preemptions so far
        ((0, 1, 2), (), {0: (0,), 1: (1,), 2: (2,)}, (3, 4), 0),
        ((0, 1, 2), (), {0: (0,), 1: (1,), 2: (2, 3)}, (4,), 0),
        ((0, 1), (2,), {0: (0, 4), 1: (1, 3)}, (2,), 1),  # 2 gave back [2, 3] as 3, 2; 1 took 3
        ((1, 2), (), {1: (1, 3), 2: (2, 4)}, (0,), 1),  # 0 done (4, 0 freed); 2 resumes with its 3 tokens
        ((2,), (), {2: (2, 4)}, (0, 3, 1), 1),
        ((2,), (), {2: (2, 4, 0)}, (3, 1), 1),
        ((), (), {}, (3, 1, 0, 4, 2), 1),
    ]
    assert [(s.running, s.waiting, s.block_tables, s.free_order, s.preemptions) for s in states] == expected
    assert states[2].tokens == {0: 3, 1: 3} and states[3].tokens == {1: 4, 2: 3}
    assert states[2].ref_cnt == (1, 1, 0, 1, 1) and states[2].owners == {0: 0, 4: 0, 1: 1, 3: 1}
    assert states[-1].ref_cnt == (0,) * 5 and states[-1].finished == 3
    system.pool.check_invariants()  # the live system holds the final memory
    assert system.pool.num_free_blocks == 5


def test_step_states_agree_with_the_series():
    """replay_steps and simulate_contiguous_vs_paged run the same loop: each state adds up to that step's values."""
    trace = synthetic_trace(60, seed=2, mean_prompt=48, mean_output=48, max_len=256, arrival_rate=1.0)
    res = simulate_contiguous_vs_paged(trace, num_slots=1024, block_size=16, max_seq_len=256, reserve="exact")
    assert res["totals"]["paged"]["preemptions"] > 0  # so that preemption is part of what agrees
    systems = {"contiguous": ContiguousReplay(1024, 256, reserve="exact"), "paged": PagedReplay(1024 // 16, 16)}
    for name, system in systems.items():
        series, states = res[name], list(replay_steps(trace, system))
        for s in states:
            t = s.step
            assert len(s.running) == series["running"][t] and len(s.waiting) == series["queue_len"][t], (name, t)
            assert sum(s.tokens.values()) == series["used_slots"][t] and s.finished == series["finished"][t]
            if name == "contiguous":
                assert s.arena.num_slots - s.arena.free_slots == series["allocated_slots"][t]
                assert s.arena.external_fragmentation == series["external_fragmentation"][t]
            else:
                assert (64 - len(s.free_order)) * 16 == series["allocated_slots"][t]
                assert sum(s.ref_cnt) == sum(len(table) for table in s.block_tables.values())
                assert all(0 <= 16 * len(table) - s.tokens[rid] < 16 for rid, table in s.block_tables.items())
        # The series go on until both systems are done; this one has nothing left by then.
        assert len(states) == res["totals"][name]["steps"] + 1 <= len(res["time"])
        assert not any(series["running"][len(states) :]) and not any(series["queue_len"][len(states) :])
        assert states[-1].preemptions == res["totals"][name]["preemptions"]
    held_back = [s.step for s in replay_steps(trace, ContiguousReplay(1024, 256, reserve="exact")) if s.held_back]
    assert held_back and all(res["contiguous"]["external_fragmentation"][t] > 0 for t in held_back)


def test_states_are_copies():
    system = PagedReplay(num_blocks=5, block_size=2)
    steps = replay_steps(HAND_TRACE, system)
    first = next(steps)
    before = (first.ref_cnt, dict(first.block_tables), dict(first.tokens), first.free_order)
    rest = list(steps)
    assert (first.ref_cnt, first.block_tables, first.tokens, first.free_order) == before
    arena_states = list(replay_steps(HAND_TRACE, ContiguousReplay(10, 5, reserve="exact")))
    assert arena_states[0].arena is not arena_states[1].arena
    assert arena_states[0].arena.reservations() == {0: (0, 3), 1: (3, 4)} and rest[-1].block_tables == {}


def test_replay_steps_validates_before_stepping():
    with pytest.raises(ValueError, match="need more than the pool's 2 blocks of 2"):
        replay_steps(HAND_TRACE, PagedReplay(num_blocks=2, block_size=2))  # request 2 needs 3 blocks
    with pytest.raises(ValueError, match="exceed max_seq_len 4"):
        replay_steps(HAND_TRACE, ContiguousReplay(num_slots=10, max_seq_len=4))
    with pytest.raises(ValueError, match="must fit in 4 slots"):
        ContiguousReplay(num_slots=4, max_seq_len=5)
    system = ContiguousReplay(num_slots=10, max_seq_len=5)
    assert len(list(replay_steps(HAND_TRACE, system))) == 8  # two buffers of 5; 2 starts when 0 is done
    with pytest.raises(ValueError, match="already run 8 steps"):
        replay_steps(HAND_TRACE, system)


def test_the_papers_three_reservation_rules():
    """Orca (Max) reserves max_seq_len, (Pow2) the next power of two of prompt + output, (Oracle) exactly that."""
    request = TraceRequest(0, 0, prompt_len=20, output_len=45)  # 65 tokens
    sizes = {rule: ContiguousReplay(1024, 512, reserve=rule).size_of(request) for rule in ("max", "pow2", "exact")}
    assert sizes == {"max": 512, "pow2": 128, "exact": 65}
    assert ContiguousReplay(1024, 100, reserve="pow2").size_of(request) == 100  # never above max_seq_len
    assert [next_power_of_two(n) for n in (1, 2, 3, 64, 65)] == [1, 2, 4, 64, 128]


@pytest.mark.parametrize("reserve", ["max", "pow2", "exact", None])
def test_future_slots_split_the_allocation(reserve):
    """Allocated = holding tokens + kept for later tokens + never filled; the oracle never over-reserves."""
    trace = synthetic_trace(60, seed=2, mean_prompt=40, mean_output=30, max_len=256, arrival_rate=2.0)
    system = PagedReplay(64, 16) if reserve is None else ContiguousReplay(1024, 256, reserve)
    s = replay(trace, system).series
    assert system.finished == len(trace) and s["running"][-1] == 0
    for used, future, allocated in zip(s["used_slots"], s["future_slots"], s["allocated_slots"], strict=True):
        assert used + future <= allocated
        if reserve == "exact":
            assert used + future == allocated
    assert sum(s["future_slots"]) > 0
