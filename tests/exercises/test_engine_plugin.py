"""``python -m exercises engine``: the learner's pieces really run inside the engine."""

from __future__ import annotations

import types

import pytest
import torch

from exercises import engine, harness

STEMS = {s: harness.STAGES[s][0] for s in harness.STAGES}


@pytest.mark.slow
def test_every_reference_piece_serves_the_demo_and_matches_the_package():
    parts = {s: harness.solution(stem) for s, stem in STEMS.items()}
    same, total, calls, texts = engine.run(parts, num_prompts=2)
    assert (same, total) == (2, 2) and texts[:2] == ["hello paged attention", "blocks like os pages"]
    assert all(calls[s] > 0 for s in engine.PIECES), calls  # each piece ran


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


def test_untouched_stubs_plug_in_nothing(capsys):
    assert engine.main(num_prompts=1) == 0
    out = capsys.readouterr().out
    assert out.count(engine.NOT_YOURS) == len(engine.PIECES)
    assert "1/1 completions identical to the package's engine" in out and "none of your stages passes" in out
