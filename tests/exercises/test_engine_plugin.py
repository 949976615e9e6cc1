"""``python -m exercises engine``: the learner's pieces really run inside the engine, through
``EnginePlugins``, on every kind of step (decode, whole prompts, chunks of a long prompt, the rest
of a prompt after a prefix hit, mixed batches, forks that copy on write)."""

from __future__ import annotations

import types

import pytest
import torch

from exercises import engine, harness
from minipaged import SamplingParams
from minipaged.tiny import task

STEMS = {s: harness.STAGES[s][0] for s in harness.STAGES}
NO_TRITON = (0, 1, 2, 3, 5, 6)  # every piece but the kernels (fast: no interpreter)


def solutions(stages=tuple(STEMS)) -> dict[int, types.ModuleType]:
    return {s: harness.solution(STEMS[s]) for s in stages}


@pytest.mark.slow
def test_every_reference_piece_serves_the_demo_and_matches_the_package():
    same, total, calls, texts = engine.run(solutions(), num_prompts=2)
    assert (same, total) == (2, 2) and texts[:2] == ["hello paged attention", "blocks like os pages"]
    assert all(calls[s] > 0 for s in engine.PIECES), calls  # each piece ran


def test_the_demo_runs_each_piece_on_every_kind_of_step():
    """Chunked prefill (steps of 64 tokens), a prefix hit behind the shared preamble, a fork of
    ``n=2`` samples that copies on write, decode and mixed steps: all identical to the package."""
    same, total, calls, texts = engine.run(solutions(NO_TRITON), num_prompts=4)
    assert (same, total) == (4, 4) and texts[:2] == ["hello paged attention", "blocks like os pages"]
    steps = calls[5]  # the learner's schedule decides every step ...
    assert steps > 0 and calls[3] == steps, calls  # ... and every step's slots are the learner's
    for kind in ("decode", "prefill", "mixed", "mid-sequence"):
        assert calls[3, kind] > 0, (kind, calls)
    assert calls[5, "chunked"] > 0, calls  # a prompt longer than the budget went in chunks
    assert calls[6, "hit"] > 0 and calls[6, "reusable_prefix_tokens"] > 0, calls
    assert calls[6, "chain_block_hashes"] > 0, calls
    assert calls[6, "copied"] > 0 and calls[1, "fork"] > 0, calls  # the n=2 samples forked and copied
    assert calls[1, "allocate"] > 0 and calls[1, "free"] > 0 and calls[2] > 0 and calls[0] == 1, calls


def test_a_prefill_after_a_prefix_hit_uses_the_learners_slots():
    """No chunking: every prompt fits one step, so a prefill that starts mid-sequence is the rest
    of a prompt whose preamble came from the cache (through the learner's lookup). The package's
    policy admits the prompts one by one in the same step, the third hitting the blocks the first
    published."""
    same, total, calls, _ = engine.run(solutions((1, 3, 6)), num_prompts=4, max_num_batched_tokens=2048)
    assert (same, total) == (4, 4)
    assert calls[3, "prefill"] == 1 and calls[6, "hit"] > 0 and calls[3, "mid-sequence"] == 1, calls


def test_a_long_prompt_in_small_chunks():
    """One prompt, 16 tokens a step: every chunk after the first starts mid-sequence."""
    rng = task.random_text(__import__("random").Random(1), 12, 16)
    prompt = task.prompt_for(rng, "You are a careful copy machine. Repeat the text exactly. ")
    requests = ([prompt], [SamplingParams(temperature=0, max_tokens=8)])
    same, total, calls, _ = engine.run(solutions((1, 3, 5, 6)), requests=requests, max_num_batched_tokens=16)
    assert (same, total) == (1, 1)
    assert calls[3, "mid-sequence"] >= 3 and calls[6, "hit"] == 0 and calls[5, "chunked"] >= 3, calls


def test_a_tight_pool_preempts_through_the_learners_schedule():
    """8 blocks for 4 prompts: the learner's schedule preempts the newest; recomputed, it finds its
    own blocks still in the prefix cache (through the learner's lookup). Still the package's text."""
    prompts, _ = engine.workload(4)
    requests = (prompts, [SamplingParams(temperature=0, max_tokens=24)] * 4)
    same, total, calls, _ = engine.run(solutions((1, 3, 5, 6)), requests=requests, num_kvcache_blocks=8)
    assert (same, total) == (4, 4)
    assert calls[5, "preempted"] > 0 and calls[6, "hit"] > 0 and calls[3] > 0, calls


def test_nothing_plugged_is_the_package_alone():
    same, total, calls, _ = engine.run({}, num_prompts=2)
    assert (same, total) == (2, 2) and not calls


def test_a_wrong_piece_changes_the_completions():
    """A decode slot mapping that sends every new token to slot 0 writes K/V where attention never
    reads them (and over a prompt's first token): the engine's text changes."""
    good = harness.solution(STEMS[3])

    def slot_zero(block_tables, context_lens, block_size):
        return torch.zeros_like(good.decode_slot_mapping(block_tables, context_lens, block_size))

    wrong = types.SimpleNamespace(decode_slot_mapping=slot_zero, prefill_slot_mapping=good.prefill_slot_mapping)
    wrong.gather_sequence_kv = good.gather_sequence_kv
    same, total, calls, _ = engine.run({3: wrong}, num_prompts=2)
    assert calls[3] > 0 and same < total


def test_an_off_by_one_prefill_slot_mapping_changes_the_completions():
    """Every prompt token one slot further on: K/V land beside where attention reads them."""
    good = harness.solution(STEMS[3])

    def shifted(block_tables, prompt_lens, block_size, pad_to):
        slots = good.prefill_slot_mapping(block_tables, prompt_lens, block_size, pad_to)
        return torch.where(slots >= 0, slots + 1, slots)

    wrong = types.SimpleNamespace(decode_slot_mapping=good.decode_slot_mapping, prefill_slot_mapping=shifted)
    wrong.gather_sequence_kv = good.gather_sequence_kv
    same, total, calls, _ = engine.run({3: wrong}, num_prompts=2)
    assert calls[3, "prefill"] > 0 and same < total


def test_a_prefix_lookup_that_reuses_the_last_token_is_refused():
    """Reusing the block of a prompt's last token would leave nothing to compute: the engine stops."""
    good = harness.solution(STEMS[6])

    def greedy(token_ids, block_size, cached):
        return good.reusable_prefix_tokens(list(token_ids) + [0] * block_size, block_size, cached) + block_size

    wrong = types.SimpleNamespace(
        chain_block_hashes=good.chain_block_hashes, reusable_prefix_tokens=greedy, copy_on_write=good.copy_on_write
    )
    with pytest.raises(ValueError, match="reusable_prefix_tokens gave"):
        engine.run({6: wrong}, num_prompts=2)


def test_untouched_stubs_plug_in_nothing(capsys):
    assert engine.main(num_prompts=1) == 0
    out = capsys.readouterr().out
    assert out.count(engine.NOT_YOURS) == len(engine.PIECES)
    assert "1/1 requests' completions identical to the package's engine" in out and "none of your stages passes" in out
