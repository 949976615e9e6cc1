"""Stage 5 exercises (notebook 05_scheduler). Check: ``python -m exercises stage5``.

Replace each ``raise NotImplementedError`` with your code; keep the names and signatures.

You write one step of a continuous-batching scheduler, the decision ``Scheduler.schedule``
makes in ``minipaged/engine/``, against the small interface below (no engine objects: what a
scheduler decides depends only on lengths and block counts). The checks drive your ``schedule``
through notebook 05's workload step by step and compare every decision with the package's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Seq:
    """A sequence as the scheduler sees it.

    num_tokens: its tokens so far (prompt + sampled); num_computed: how many of them have K/V in
    the cache; num_blocks: the KV blocks it holds. A step computes some of the missing
    ``num_tokens - num_computed`` tokens: all of a prompt, a chunk of it, or one token (a decode).
    """

    name: str
    num_tokens: int
    num_computed: int = 0
    num_blocks: int = 0


@dataclass
class Step:
    """One step's decisions.

    scheduled: ``(name, new tokens)`` of every sequence that computes this step, in the order they
    were decided (running ones first, then admitted ones); preempted: the names of the sequences
    preempted this step, in the order they were preempted.
    """

    scheduled: list[tuple[str, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)


def blocks_to_grow(num_computed_tokens: int, num_new_tokens: int, num_blocks_held: int, block_size: int) -> int:
    """How many new blocks a sequence must allocate before a step writes ``num_new_tokens`` more tokens.

    The sequence has K/V for ``num_computed_tokens`` tokens in ``num_blocks_held`` blocks of
    ``block_size`` slots (only the last may be partly filled); after the step it holds
    ``num_computed_tokens + num_new_tokens``. This is ``BlockTable.new_blocks_needed``. Never negative.

    Examples (block size 16): a 20-token prompt from scratch -> 2; a decode at 24 tokens held in
    2 blocks -> 0; a decode at 32 tokens in 2 blocks -> 1; a chunk of 50 after 10 -> 3.
    """
    raise NotImplementedError


def schedule(
    waiting: list[Seq],
    running: list[Seq],
    free_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> Step:
    """Decide one step; return a :class:`Step`. Do not change the arguments (work on copies).

    waiting: sequences not running, front first (a new prompt, or a preempted sequence, which
    holds no blocks and has ``num_computed == 0``); running: in admission order, oldest first;
    free_blocks: free blocks in the pool. The step may compute at most ``max_num_batched_tokens``
    tokens (the budget) and run at most ``max_num_seqs`` sequences.

    1. Running sequences first, oldest first, while the budget lasts (stop when it is 0). Each
       asks for ``n = min(its missing tokens, budget left)``; that needs ``blocks_to_grow(...)``
       new blocks. While there are not enough free blocks, **preempt** the newest running
       sequence (the last of ``running`` not preempted yet): its blocks become free and it will go
       back to the front of the waiting queue (the caller does that). If the victim is the very
       sequence asking, it gets nothing this step; move on to the next one. A sequence that gets
       its blocks is scheduled with ``n`` tokens, and ``n`` leaves the budget.
    2. Then, **only if nobody was preempted** this step, admit waiting sequences, front first,
       while the budget is not 0. Stop at the first one that does not fit: running (with those
       admitted so far) would exceed ``max_num_seqs``, or the blocks for its
       ``n = min(its missing tokens, budget left)`` tokens are not free. A prompt longer than the
       budget left is admitted with a chunk of ``n`` tokens (chunked prefill); the rest of it comes
       in later steps.

    Example, block size 4, 7 free blocks, budget 64, max 8 sequences, nothing running, waiting
    prompts of 10, 20 and 5 tokens: ``Step(scheduled=[("A", 10)], preempted=[])`` — 10 tokens
    take 3 blocks, 20 need 5 and only 4 are left, and the 5-token prompt waits behind it (FIFO).

    Hint: keep your own copy of ``running`` and a count of free blocks; a preempted sequence's
    ``num_blocks`` come back at once.
    """
    raise NotImplementedError
