"""A row added to a step's transaction as the scheduler adds it: its request group says who
samples from it, how, and which prompt tokens it scores (the transaction never asks)."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from minipaged.engine.sequence import Sequence
from minipaged.engine.step_transaction import StepTransaction


def add_row(tx: StepTransaction, seq: Sequence, n: int, table: Seq[int]) -> None:
    group = seq.group
    tx.add(seq, n, table, group.samplers(seq), group.num_candidates, group.scored_prompt(seq, n))
