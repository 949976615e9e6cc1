"""A step in three plain records, handed one way: ``SchedulerOutput`` -> ``ModelRunnerOutput`` ->
``StepOutput``; request groups that decide as data; observers that only read."""

from __future__ import annotations

import ast
from pathlib import Path

from minipaged.engine.decisions import Append, Finish, Fork
from minipaged.engine.llm import LLM
from minipaged.engine.request_group import SampleGroup
from minipaged.engine.runner_output import ModelRunnerOutput
from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.scheduler_output import SchedulerOutput
from minipaged.engine.step_output import StepOutput
from minipaged.engine.stop_checker import StopChecker

ENGINE = Path(__file__).resolve().parents[2] / "minipaged" / "engine"
GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


def test_a_step_hands_back_its_three_records_and_the_outputs_step_returns():
    llm, twin = LLM(num_kvcache_blocks=16), LLM(num_kvcache_blocks=16)
    for engine in (llm, twin):
        engine.add_request([5, 6, 7], GREEDY)
        engine.add_request([8, 9], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    out = llm.engine_step()
    assert isinstance(out, StepOutput) and out.step == llm.num_steps == 1
    assert isinstance(out.scheduler_output, SchedulerOutput) and isinstance(out.runner_output, ModelRunnerOutput)
    assert out.scheduler_output.q_lens == [3, 2] and out.num_sampled == 2
    assert [type(d) for d in out.decisions] == [Append, Append, Finish]  # the second request's one token ends it
    assert out.request_ids == [0, 1] and out.finished == [1] and out.num_running == 1
    assert out.outputs == twin.step()  # the same step, as LLM.step returns it
    assert {"schedule", "prepare", "forward", "attention", "sample", "update", "total"} <= set(out.seconds)
    assert "SchedulerOutput(" in repr(out.scheduler_output)  # a dataclass a learner can print


def test_observers_subscribe_and_see_the_peak_before_anything_is_freed():
    llm = LLM(num_kvcache_blocks=16, block_size=4)
    seen: list[StepOutput] = []
    llm.subscribe(seen.append)
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    llm.unsubscribe(seen.append)
    assert [o.step for o in seen] == [1, 2] and llm.observers == []
    assert [o.kv_stats_at_peak["tokens_held"] for o in seen if o.kv_stats_at_peak] == [3, 4]
    assert llm.kv_stats()["tokens_held"] == 0  # freed once the step's decisions were applied
    pool = llm.pool_summary()
    assert pool.running == [] and pool.num_free_blocks == 16 and len(pool.ref_cnt) == 16


def test_the_pool_a_step_left_rides_in_its_record_when_asked_for():
    llm, twin = LLM(num_kvcache_blocks=16, block_size=4), LLM(num_kvcache_blocks=16, block_size=4)
    for engine in (llm, twin):
        engine.add_request([1, 2, 3, 4, 5], GREEDY)
    assert twin.engine_step().pool is None  # nobody asked: no copy of the pool
    out = llm.engine_step(pool=True)
    assert out.pool == llm.pool_summary() and out.pool.ref_cnt[:2] == [1, 1] and out.pool.num_free_blocks == 14
    pools: list = []

    def keep(step: StepOutput) -> None:
        pools.append(step.pool)

    llm.subscribe(keep, pool=True)
    llm.engine_step()
    llm.unsubscribe(keep)
    llm.engine_step()
    assert len(pools) == 1 and pools[0].running[0].num_computed_tokens == 6
    assert llm.engine_step().pool is None  # the observer that wanted it is gone


def test_a_sample_group_decides_without_changing_its_sequence():
    group = SampleGroup(0, None, [1, 2, 3], SamplingParams(temperature=0, max_tokens=1), block_size=4)
    seq = group.seqs[0]
    decisions = group.receive(seq, ModelRunnerOutput(token_ids=[9]), 0, StopChecker([2], max_model_len=32))
    assert decisions == [Append(seq, 9), Finish(seq, "length")]
    assert seq.token_ids == [1, 2, 3] and seq.finish_reason is None  # the scheduler applies them


def test_forked_samples_are_decisions_too():
    group = SampleGroup(0, None, [1, 2, 3], SamplingParams(n=3, max_tokens=2), block_size=4)
    first, *rest = group.seqs
    assert group.forks({first.seq_id}) == []  # a sibling that did not sample yet does not fork
    assert group.forks({s.seq_id for s in group.seqs}) == [Fork(first, s) for s in rest]
    assert group.unforked == []


def _names_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }


def test_the_scheduler_never_asks_which_kv_layout_it_has():
    names = _names_in(ENGINE / "scheduler.py")
    assert not names & {"PagedKVManager", "ContiguousKVManager", "paged", "sharing", "kv_layout"}


def test_request_groups_never_call_the_scheduler():
    for module in ("request_group.py", "beam_search.py", "step_transaction.py"):
        assert "Scheduler" not in _names_in(ENGINE / module) and "scheduler" not in _names_in(ENGINE / module), module
