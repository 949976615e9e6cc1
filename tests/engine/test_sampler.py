"""The batched sampler on its own: greedy rows, filters, and per-sequence random streams."""

from __future__ import annotations

import pytest
import torch

from minipaged import SamplingParams
from minipaged.engine.model_runner import sample


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_rows_take_the_argmax():
    logits = torch.randn(5, 50, generator=gen(0))
    params = [SamplingParams(temperature=0)] * 5
    assert sample(logits, params, [None] * 5) == logits.argmax(-1).tolist()


def test_filters_that_leave_one_token_equal_greedy():
    logits = torch.randn(4, 50, generator=gen(1))
    params = [SamplingParams(top_k=1), SamplingParams(top_p=1e-6), SamplingParams(temperature=1e-6), SamplingParams()]
    got = sample(logits, params, [gen(i) for i in range(4)])
    assert got[:3] == logits.argmax(-1).tolist()[:3]


def test_top_k_never_picks_outside_the_k_best():
    logits = torch.randn(1, 30, generator=gen(2))
    best = set(logits[0].topk(3).indices.tolist())
    g = gen(3)
    picks = {sample(logits, [SamplingParams(top_k=3)], [g])[0] for _ in range(200)}
    assert picks <= best and len(picks) == 3


@pytest.mark.slow
def test_frequencies_follow_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    g, n = gen(4), 4000
    counts = torch.bincount(torch.tensor([sample(logits, [SamplingParams()], [g])[0] for _ in range(n)]), minlength=4)
    want = torch.softmax(logits[0], -1) * n
    assert torch.all((counts - want).abs() < 4 * want.sqrt() + 5)  # within ~4 standard deviations


def test_a_seeded_row_does_not_depend_on_its_neighbours():
    logits = torch.randn(3, 40, generator=gen(5))
    p = SamplingParams(temperature=0.9, top_p=0.9, seed=1)
    g_alone, g_mixed = gen(11), gen(11)
    alone = [sample(logits[1:2], [p], [g_alone])[0] for _ in range(20)]
    mixed = [
        sample(logits, [SamplingParams(temperature=0), p, SamplingParams()], [None, g_mixed, None])[1]
        for _ in range(20)
    ]
    assert mixed == alone and len(set(alone)) > 1
