"""The scheduler on its own: queues, token budget, preemption, forks and stop rules — no model."""

from __future__ import annotations

from minipaged import SamplingParams
from minipaged.engine.kv_manager import PagedKVManager
from minipaged.engine.request_group import SampleGroup
from minipaged.engine.runner_output import ModelRunnerOutput
from minipaged.engine.scheduler import Scheduler
from minipaged.engine.sequence import Sequence, Status
from minipaged.engine.stop_checker import StopChecker

BS = 4


def seq(n: int, max_tokens: int = 8, **kw) -> Sequence:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **kw)
    return SampleGroup(0, None, list(range(1, n + 1)), params, BS).seqs[0]


def scheduler(num_blocks: int = 16, max_num_seqs: int = 8, budget: int = 64, eos=(99,)) -> Scheduler:
    return Scheduler(PagedKVManager(num_blocks, BS, False), max_num_seqs, budget, StopChecker(eos, max_model_len=32))


def family(request_id: int, n: int, params: SamplingParams) -> list[Sequence]:
    return SampleGroup(request_id, None, list(range(1, n + 1)), params, BS).seqs


def run(s: Scheduler, token: int = 7) -> list[Sequence]:
    """One step without a model: schedule, pretend it ran, sample ``token`` for whoever samples."""
    batch = s.schedule()
    return s.postprocess(batch, ModelRunnerOutput([token] * len(batch.samples)))


def finished(seqs: list[Sequence]) -> list[Sequence]:
    return [q for q in seqs if q.status is Status.FINISHED]


def test_budget_chunks_prefill_and_admits_in_order():
    s = scheduler(budget=10)
    a, b, c = seq(6), seq(7), seq(3)
    for q in (a, b, c):
        s.add(q.group)
    batch = s.schedule()
    assert [(q is a, n) for q, n in zip(batch.seqs, batch.q_lens)] == [(True, 6), (False, 4)]  # b chunked
    assert list(s.waiting) == [c]


def test_max_num_seqs_counts_pending_forks():
    s = scheduler(max_num_seqs=4)
    a, b = family(0, 3, SamplingParams(n=3, max_tokens=4)), family(1, 3, SamplingParams(n=3, max_tokens=4))
    s.add(a[0].group)
    s.add(b[0].group)
    assert s.schedule().seqs == [a[0]]  # a will be 3 sequences: b's 3 more would make 6


def test_fork_after_prefill_shares_blocks():
    s = scheduler()
    a = family(0, 6, SamplingParams(n=3, max_tokens=4, seed=0))
    s.add(a[0].group)
    batch = s.schedule()
    assert [(row, q) for row, q in batch.samples] == [(0, a[0]), (0, a[1]), (0, a[2])] and s.running == [a[0]]
    s.postprocess(batch, ModelRunnerOutput([7, 8, 9]))
    assert s.running == a and [q.output_token_ids for q in a] == [[7], [8], [9]]
    tables = [q.block_table.block_ids for q in a]
    assert tables[0] == tables[1] == tables[2]
    assert [s.kv.pool.blocks[b].ref_cnt for b in tables[0]] == [3, 3]


def test_the_newest_is_preempted_when_the_pool_runs_dry():
    s = scheduler(num_blocks=4, budget=64)
    old, new = seq(8, max_tokens=20), seq(7, max_tokens=20)  # 2 blocks each: the pool is full
    s.add(old.group)
    s.add(new.group)
    run(s)  # both prefilled, one token sampled each: old has 9 tokens and needs a third block
    batch = s.schedule()
    assert batch.preempted == [new] and batch.seqs == [old]
    assert new.status is Status.WAITING and new.num_computed_tokens == 0 and s.waiting[0] is new
    assert s.num_preemptions == 1


def run_tokens(s: Scheduler, tokens: list[int]) -> list[Sequence]:
    batch = s.schedule()
    return s.postprocess(batch, ModelRunnerOutput(tokens))


def test_stop_rules():
    s = scheduler(eos=(99, 98))
    a, b, c = seq(3, max_tokens=1), seq(3), seq(3, ignore_eos=True)
    for q in (a, b, c):
        s.add(q.group)
    assert finished(run_tokens(s, [5, 98, 98])) == [a, b] and (a.finish_reason, b.finish_reason) == ("length", "stop")
    assert c.status is Status.RUNNING and s.running == [c]
    assert s.kv.pool.num_free_blocks == 15  # a's and b's blocks came back


def test_max_model_len_stops_a_sequence():
    s = scheduler()
    a = seq(30, max_tokens=50)
    s.add(a.group)
    run(s)
    run(s)
    assert a.finish_reason == "length" and len(a) == 32


def test_abort_from_either_queue():
    s = scheduler(max_num_seqs=1)
    a, b = seq(5), seq(5)
    s.add(a.group)
    s.add(b.group)
    s.schedule()
    s.abort([a, b])
    assert not s.has_unfinished() and a.finish_reason == b.finish_reason == "abort"
    assert s.kv.pool.num_free_blocks == 16
