"""Request groups on their own: what a request of ``n`` samples and a beam search each tell the
scheduler (queue, unit, seats, plan, samplers), and the one place that tells them apart."""

from __future__ import annotations

import pytest
import torch

from minipaged import BeamSearchParams, SamplingParams
from minipaged.engine.beam_search import BeamGroup, lockstep_plan
from minipaged.engine.inputs import Limits, check_request, group_class
from minipaged.engine.request_group import SampleGroup
from minipaged.engine.sequence import Status

BS = 4
PROMPT = [1, 2, 3, 4, 5, 6]


def samples(n: int, can_fork: bool = True, **kw) -> SampleGroup:
    return SampleGroup(7, "text", PROMPT, SamplingParams(n=n, max_tokens=4, **kw), BS, can_fork)


def beams(width: int) -> BeamGroup:
    return BeamGroup(8, None, PROMPT, BeamSearchParams(beam_width=width, max_tokens=4), BS, eos_token_ids=[0])


def test_the_params_choose_the_group():
    assert group_class(SamplingParams()) is SampleGroup
    assert group_class(BeamSearchParams(beam_width=2)) is BeamGroup
    assert group_class({"temperature": 0}) is None


def test_n_samples_on_a_sharing_cache_queue_one_sequence_that_holds_n_seats():
    g = samples(3)
    first, *rest = g.seqs
    assert [s.sample_index for s in g.seqs] == [0, 1, 2] and all(s.group is g for s in g.seqs)
    assert g.queue() == [first] and g.unforked == rest
    assert g.unit(first) == [first] and g.seats([first]) == 3
    assert g.samplers(first) == g.seqs  # the siblings draw their first token from the prompt's row
    assert g.num_candidates == 0 and g.streams and not g.finished


def test_without_sharing_every_sample_computes_its_prompt():
    g = samples(3, can_fork=False)
    assert g.queue() == g.seqs and g.unforked == []
    assert [g.seats([s]) for s in g.seqs] == [1, 1, 1]
    assert [g.samplers(s) for s in g.seqs] == [[s] for s in g.seqs]


def test_a_sample_plans_its_missing_tokens_within_the_budget():
    g = samples(1)
    (s,) = g.seqs
    assert g.plan([s], [0], budget=100) == [6] and g.plan([s], [0], budget=4) == [4]
    assert g.plan([s], [4], budget=100) == [2]  # a prefix hit of 4 tokens: 2 left to compute


def test_seeded_samples_draw_from_their_own_streams():
    a, b = samples(2, seed=5), samples(2, seed=5)
    draws = [[torch.rand(1, generator=s.generator).item() for s in g.seqs] for g in (a, b)]
    assert draws[0] == draws[1] and draws[0][0] != draws[0][1]  # same request seed: same streams
    assert all(s.generator is None for s in samples(2).seqs)


def test_a_beam_search_is_one_unit_of_its_live_beams():
    g = beams(3)
    (first,) = g.seqs
    assert g.queue() == [first] and g.live == [first] and first.group is g
    second = first.branch()
    g.live.append(second)
    assert g.unit(first) == g.unit(second) == [first, second]
    assert g.seats([first]) == 3 and g.members() == [first, second]
    assert g.samplers(first) == [first]
    assert g.num_candidates == 6 and not g.streams


def test_beams_step_in_lockstep():
    assert lockstep_plan([6], 4) == [4]
    assert lockstep_plan([3, 3], 10) == [3, 3]  # all reach their last token together
    assert lockstep_plan([3, 3], 4) == [2, 2]  # each stops one short of it
    assert lockstep_plan([1, 1], 1) is None  # nobody can move without sampling alone
    g = beams(2)
    assert g.plan(g.seqs, [0], budget=4) == [4]


def test_a_group_is_finished_when_every_member_is():
    g = samples(2, can_fork=False)
    g.seqs[0].status = Status.FINISHED
    assert not g.finished
    g.seqs[1].status = Status.FINISHED
    assert g.finished


def limits(can_fork: bool = True, tokenizer: bool = False) -> Limits:
    return Limits(100, 64, 4, 32, tokenizer, can_fork, lambda tokens, seqs: None)


def test_each_kind_checks_what_only_it_needs():
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        check_request(PROMPT, SamplingParams(stop=["x"]), 0, limits())
    with pytest.raises(ValueError, match="beam search shares blocks"):
        check_request(PROMPT, BeamSearchParams(beam_width=2), 0, limits(can_fork=False))
    with pytest.raises(ValueError, match="n=5 samples but max_num_seqs=4"):
        check_request(PROMPT, SamplingParams(n=5), 0, limits())
    with pytest.raises(ValueError, match="beam_width=5 beams but max_num_seqs=4"):
        check_request(PROMPT, BeamSearchParams(beam_width=5), 0, limits())
    with pytest.raises(TypeError, match="must be a SamplingParams, got dict"):
        check_request(PROMPT, {"n": 1}, 0, limits())  # type: ignore[arg-type]
