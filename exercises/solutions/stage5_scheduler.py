"""Reference solutions for stage 5 (notebook 05_scheduler)."""

from __future__ import annotations

from collections.abc import Sequence


def pick_victim(running: Sequence) -> int:
    """The most recently admitted sequence: the last one."""
    if not running:
        raise ValueError("no running sequence to preempt")
    return len(running) - 1


def blocks_to_grow(num_computed_tokens: int, num_new_tokens: int, num_blocks_held: int, block_size: int) -> int:
    """ceil(tokens after the step / block_size) - blocks held, never negative."""
    needed = -(-(num_computed_tokens + num_new_tokens) // block_size)
    return max(0, needed - num_blocks_held)


def num_admitted(
    waiting_lens: Sequence[int],
    num_running: int,
    num_free_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> int:
    """FIFO admission within the sequence, token and block limits (a chunk when the budget is short)."""
    budget = max(0, max_num_batched_tokens - num_running)  # each running sequence decodes one token
    free, admitted = num_free_blocks, 0
    for length in waiting_lens:
        if budget == 0 or num_running + admitted + 1 > max_num_seqs:
            break
        tokens = min(length, budget)
        blocks = -(-tokens // block_size)
        if blocks > free:
            break
        free -= blocks
        budget -= tokens
        admitted += 1
    return admitted
