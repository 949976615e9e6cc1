"""What the scheduler decides for one step, and what the runner hands back.

Rows are added by the step's transaction (:meth:`StepTransaction.add
<minipaged.engine.step_transaction.StepTransaction.add>`), which also keeps what adding them
changed.

:class:`ScheduledBatch` is the whole of a step's work, so that the model runner needs nothing
else: which sequences compute how many new tokens (and where their K/V go: ``block_tables``),
which rows sample, and the block moves to make before the forward — copy-on-write copies
(``blocks_to_copy``), and K/V going to or coming from host memory (``blocks_to_swap_out``,
``blocks_to_swap_in``). :class:`SamplerOutput` is what the runner returns: one token per
sampling row, or for a beam, its most likely tokens with their log-probabilities; and the
log-probabilities a request asked for (:mod:`minipaged.engine.logprobs`).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from minipaged.engine.logprobs import TokenLogprobs
from minipaged.engine.sequence import Sequence


@dataclass
class ScheduledBatch:
    """Row ``i`` computes ``q_lens[i]`` new tokens of ``seqs[i]`` from position ``starts[i]``;
    its blocks are ``block_tables[i]`` (of ``block_size`` slots each).

    ``samples``: ``(row, seq)`` for every sequence that samples its next token from that row's
    logits: a sequence whose step reaches its last token, and the samples that fork from a prompt
    that just finished (they share their parent's row). ``decode``: whether a row computes just
    the token sampled last (:meth:`Sequence.is_decode`, the one definition). ``prompt_logprobs``:
    ``(row, positions, k)`` for every row that scores prompt tokens (the tokens at ``positions``,
    each with its ``k`` most likely alternatives; see :mod:`~minipaged.engine.logprobs`). ``preempted``:
    sequences that lost their blocks this step (to recompute), and ``swapped_out`` those moved to
    host memory. (The step's random states and staged blocks are the transaction's:
    :class:`~minipaged.engine.step_transaction.StepTransaction`.)
    """

    block_size: int = 1
    seqs: list[Sequence] = field(default_factory=list)
    q_lens: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    block_tables: list[Seq[int]] = field(default_factory=list)
    decode: list[bool] = field(default_factory=list)
    samples: list[tuple[int, Sequence]] = field(default_factory=list)
    prompt_logprobs: list[tuple[int, range, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) device blocks
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host, device)
    preempted: list[Sequence] = field(default_factory=list)
    swapped_out: list[Sequence] = field(default_factory=list)


@dataclass
class SamplerOutput:
    """``token_ids[i]``: the token drawn for ``samples[i]``; ``candidates[i]``: for a beam, its
    ``2 x beam_width`` most likely tokens as ``(token, logprob)``, most likely first.
    ``logprobs[i]``: the entry of the token drawn for ``samples[i]``, if its request asked;
    ``prompt_logprobs[row]``: the entries of the prompt tokens that row scored, in order."""

    token_ids: list[int] = field(default_factory=list)
    candidates: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)
