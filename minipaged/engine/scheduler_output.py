"""The first of a step's three records: what the scheduler decided (vLLM V1's ``SchedulerOutput``).

One step hands three plain records one way (:mod:`minipaged.engine`)::

    SchedulerOutput  --runner-->  ModelRunnerOutput  --scheduler-->  StepOutput

:class:`SchedulerOutput` is the whole of a step's work, so that the model runner needs nothing
else: which sequences compute how many new tokens (and where their K/V go: ``block_tables``),
which rows sample (and how: one drawn token, or a beam's most likely candidates), and the block
moves to make before the forward — copy-on-write copies (``blocks_to_copy``), and K/V going to
or coming from host memory (``blocks_to_swap_out``, ``blocks_to_swap_in``). Rows are added by
the step's transaction (:meth:`StepTransaction.add
<minipaged.engine.step_transaction.StepTransaction.add>`), which also keeps what adding them
changed. Print one: it is a dataclass.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from minipaged.engine.sequence import Sequence


@dataclass
class SchedulerOutput:
    """Row ``i`` computes ``q_lens[i]`` new tokens of ``seqs[i]`` from position ``starts[i]``;
    its blocks are ``block_tables[i]`` (of ``block_size`` slots each).

    ``samples``: ``(row, seq)`` for every sequence that samples its next token from that row's
    logits: a sequence whose step reaches its last token, and the samples that fork from a prompt
    that just finished (they share their parent's row). ``candidates[i]``: for ``samples[i]``, 0
    to draw one token, else how many most likely tokens a beam search wants. ``decode``: whether a
    row computes just the token sampled last (:meth:`Sequence.is_decode`, the one definition).
    ``prompt_logprobs``: ``(row, positions, k)`` for every row that scores prompt tokens (the
    tokens at ``positions``, each with its ``k`` most likely alternatives; see
    :mod:`~minipaged.engine.logprobs`). ``preempted``: sequences that lost their blocks this step
    (to recompute), and ``swapped_out`` those moved to host memory. (The step's random states and
    staged blocks are the transaction's: :class:`~minipaged.engine.step_transaction.StepTransaction`.)
    """

    block_size: int = 1
    seqs: list[Sequence] = field(default_factory=list)
    q_lens: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    block_tables: list[Seq[int]] = field(default_factory=list)
    decode: list[bool] = field(default_factory=list)
    samples: list[tuple[int, Sequence]] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)  # per sample: 0 draws, k > 0 wants the top k
    prompt_logprobs: list[tuple[int, range, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) device blocks
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host, device)
    preempted: list[Sequence] = field(default_factory=list)
    swapped_out: list[Sequence] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens the step computes, every row together (vLLM's ``total_num_scheduled_tokens``)."""
        return sum(self.q_lens)
