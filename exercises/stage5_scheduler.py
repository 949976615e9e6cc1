"""Stage 5 exercises (notebook 05_scheduler). Check: ``pytest tests/exercises -k stage5``.

Replace each ``raise NotImplementedError`` with your code; keep the names and signatures. The
tests compare your answers with what the package's ``Scheduler`` and ``PagedKVManager``
(``minipaged/engine/``) really do.
"""

from __future__ import annotations

from collections.abc import Sequence


def pick_victim(running: Sequence) -> int:
    """The preemption victim: the index in ``running`` of the sequence to preempt.

    running: the running sequences in admission order (oldest first; never empty). minipaged,
    like vLLM, preempts the most recently admitted one (``Scheduler.schedule`` calls
    ``self._preempt(self.running[-1], ...)``): it has computed the least, so recomputing it later
    costs the least, and the oldest requests keep making progress.

    Then think about another policy (the sequence holding the most blocks?): what would it change
    in notebook 05's timeline, and which requests could starve?
    """
    raise NotImplementedError


def blocks_to_grow(num_computed_tokens: int, num_new_tokens: int, num_blocks_held: int, block_size: int) -> int:
    """How many new blocks a sequence must allocate before a step writes ``num_new_tokens`` more tokens.

    The sequence has K/V for ``num_computed_tokens`` tokens in ``num_blocks_held`` blocks of
    ``block_size`` slots (only the last may be partly filled); after the step it holds
    ``num_computed_tokens + num_new_tokens``. This is ``PagedKVManager.blocks_needed`` without
    prefix caching (and ``BlockTable.new_blocks_needed``). Never negative.

    Examples (block size 16): a 20-token prompt from scratch -> 2; a decode at 24 tokens held in
    2 blocks -> 0; a decode at 32 tokens in 2 blocks -> 1; a chunk of 50 after 10 -> 3.
    """
    raise NotImplementedError


def num_admitted(
    waiting_lens: Sequence[int],
    num_running: int,
    num_free_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> int:
    """How many waiting prompts one step admits, as ``Scheduler.schedule`` does (no prefix caching).

    waiting_lens: the prompt lengths of the waiting queue, front first (nothing computed yet);
    num_running: sequences already running, each **decoding** one token this step (so they take
    ``num_running`` tokens of the step's budget ``max_num_batched_tokens`` first); num_free_blocks:
    free blocks once the running sequences have grown.

    Admit in FIFO order and stop at the first prompt that does not fit:

    - sequences: running + admitted may not exceed ``max_num_seqs``;
    - tokens: a prompt takes ``min(its length, tokens left in the budget)`` tokens — a prompt
      longer than what is left is admitted with a chunk (chunked prefill), so only an exhausted
      budget stops admission;
    - blocks: that many tokens need ``ceil(tokens / block_size)`` blocks, which must be free.

    Example: ``num_admitted([10, 20, 5], 0, 7, 4, 8, 64)`` is 1: 10 tokens take 3 blocks, 20 need 5
    but only 4 are left, and the 5-token prompt behind it waits (FIFO).
    """
    raise NotImplementedError
