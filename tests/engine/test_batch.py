"""``SchedulerOutput.add`` through the step's transaction (``StepTransaction.add``): where each row
starts, how many tokens it brings, whether it is a decode, which rows sample (and for whom: the
request group says), and the seeded generators' states the transaction keeps."""

from __future__ import annotations

import torch
from rows import add_row

from minipaged import SamplingParams
from minipaged.engine.beam_search import BeamGroup
from minipaged.engine.request_group import SampleGroup
from minipaged.engine.runner_output import ModelRunnerOutput
from minipaged.engine.sampling_params import BeamSearchParams
from minipaged.engine.scheduler_output import SchedulerOutput
from minipaged.engine.sequence import Sequence
from minipaged.engine.step_transaction import StepTransaction

BS = 4
GREEDY = SamplingParams(temperature=0, max_tokens=8)


def family(tokens: list[int], params: SamplingParams, can_fork: bool = True) -> list[Sequence]:
    return SampleGroup(0, None, tokens, params, BS, can_fork).seqs


def seq(n: int, params=GREEDY, computed: int = 0, outputs=()) -> Sequence:
    tokens = list(range(1, n + 1))
    if isinstance(params, BeamSearchParams):
        s = BeamGroup(0, None, tokens, params, BS, eos_token_ids=()).seqs[0]
    else:
        s = family(tokens, params)[0]
    s.token_ids += list(outputs)
    s.num_computed_tokens = computed
    return s


def test_rows_keep_starts_q_lens_and_tables_in_order():
    tx = StepTransaction(BS)
    batch = tx.batch
    a, b = seq(10, computed=4), seq(5, computed=5, outputs=[7])
    add_row(tx, a, 4, [3, 7])
    add_row(tx, b, 1, [5, 6])
    assert batch.seqs == [a, b]
    assert batch.starts == [4, 5] and batch.q_lens == [4, 1]
    assert batch.block_tables == [[3, 7], [5, 6]] and batch.block_size == BS
    assert batch.decode == [False, True]
    assert batch.samples == [(1, b)]  # a's chunk ends at token 8 of 10: no logits wanted


def test_a_chunk_samples_only_when_it_reaches_the_last_token():
    tx = StepTransaction(BS)
    batch = tx.batch
    a = seq(10)
    add_row(tx, a, 9, [0, 1, 2])
    assert batch.samples == [] and batch.decode == [False]
    a.num_computed_tokens = 9
    add_row(tx, a, 1, [0, 1, 2])  # the prompt's last token: the first sample, but not a decode
    assert batch.samples == [(1, a)] and batch.decode == [False, False]


def test_decode_means_the_one_token_sampled_last():
    tx = StepTransaction(BS)
    batch = tx.batch
    one_token_prompt = seq(1)
    recomputed = seq(5, outputs=[7, 8])  # preempted by recompute: every token again
    last_of_recompute = seq(5, computed=6, outputs=[7, 8])
    decoding = seq(5, computed=6, outputs=[7, 8])
    add_row(tx, one_token_prompt, 1, [0])
    add_row(tx, recomputed, 7, [1, 2])
    add_row(tx, last_of_recompute, 1, [3, 4])
    add_row(tx, decoding, 1, [5, 6])
    assert batch.decode == [False, False, True, True]
    assert [row for row, _ in batch.samples] == [0, 1, 2, 3]


def test_a_finished_prompt_samples_for_its_unforked_siblings_on_the_same_row():
    params = SamplingParams(n=3, max_tokens=4)
    samples = family([1, 2, 3, 4, 5, 6], params)
    other = seq(3)
    tx = StepTransaction(BS)
    batch = tx.batch
    add_row(tx, other, 3, [0])
    add_row(tx, samples[0], 6, [1, 2])
    assert batch.samples == [(0, other), (1, samples[0]), (1, samples[1]), (1, samples[2])]
    assert batch.seqs == [other, samples[0]] and batch.q_lens == [3, 6]  # the forks take no row


def test_unforked_siblings_wait_while_the_prompt_is_chunked():
    params = SamplingParams(n=2, max_tokens=4, seed=3)
    samples = family([1, 2, 3, 4, 5, 6], params)
    tx = StepTransaction(BS)
    batch = tx.batch
    add_row(tx, samples[0], 4, [0])
    assert batch.samples == [] and tx.rng_states == []


def test_samples_that_do_not_fork_sample_alone():
    params = SamplingParams(n=2, max_tokens=4)
    samples = family([1, 2, 3], params, can_fork=False)  # e.g. a contiguous cache
    tx = StepTransaction(BS)
    batch = tx.batch
    add_row(tx, samples[0], 3, [0])
    add_row(tx, samples[1], 3, [1])
    assert batch.samples == [(0, samples[0]), (1, samples[1])]


def test_seeded_generators_states_are_kept_for_each_sample():
    params = SamplingParams(n=3, max_tokens=4, seed=11)
    samples = family([1, 2, 3, 4, 5], params)
    samples[1].generator.manual_seed(99)  # states differ from the parent's
    tx = StepTransaction(BS)
    unseeded = seq(2, params=SamplingParams(max_tokens=4))
    add_row(tx, unseeded, 2, [0])
    add_row(tx, samples[0], 5, [1, 2])
    assert [g for g, _ in tx.rng_states] == [s.generator for s in samples]
    first = [torch.rand(1, generator=s.generator).item() for s in samples]  # the step draws ...
    for g, state in tx.rng_states:  # ... fails, and gives the draws back
        g.set_state(state)
    assert [torch.rand(1, generator=s.generator).item() for s in samples] == first
    assert len(set(first)) == 3


def test_unseeded_and_beam_rows_keep_no_generator_state():
    tx = StepTransaction(BS)
    batch = tx.batch
    beam = seq(4, params=BeamSearchParams(beam_width=2, max_tokens=4))
    add_row(tx, seq(3, params=SamplingParams(temperature=0.8)), 3, [0])
    add_row(tx, beam, 4, [1])
    assert tx.rng_states == [] and [row for row, _ in batch.samples] == [0, 1]


def test_a_new_batch_and_output_start_empty():
    tx, out = StepTransaction(BS), ModelRunnerOutput()
    batch = tx.batch
    assert (batch.seqs, batch.samples, batch.blocks_to_copy, tx.rng_states) == ([], [], [], [])
    assert (out.token_ids, out.candidates) == ([], {})
    add_row(tx, seq(2), 2, [0])
    assert SchedulerOutput().seqs == []  # no list shared between batches
