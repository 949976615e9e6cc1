"""Reference solutions for stage 5 (notebook 05_scheduler)."""

from __future__ import annotations

from exercises.stage5_scheduler import Seq, Step  # the interface, shared with the stub
from minipaged.utils import cdiv


def blocks_to_grow(num_computed_tokens: int, num_new_tokens: int, num_blocks_held: int, block_size: int) -> int:
    """ceil(tokens after the step / block_size) - blocks held, never negative."""
    return max(0, cdiv(num_computed_tokens + num_new_tokens, block_size) - num_blocks_held)


def schedule(
    waiting: list[Seq],
    running: list[Seq],
    free_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> Step:
    """Running sequences first (preempting the newest when blocks run out), then FIFO admission."""
    step = Step()
    alive = list(running)  # running and not preempted this step
    budget, free = max_num_batched_tokens, free_blocks
    for seq in running:
        if budget == 0:
            break
        if seq.name in step.preempted:  # preempted earlier in this loop
            continue
        n = min(seq.num_tokens - seq.num_computed, budget)
        need = blocks_to_grow(seq.num_computed, n, seq.num_blocks, block_size)
        while need > free and seq.name not in step.preempted:
            victim = alive.pop()  # the newest
            free += victim.num_blocks
            step.preempted.append(victim.name)
        if seq.name not in step.preempted:
            free -= need
            budget -= n
            step.scheduled.append((seq.name, n))
    if step.preempted:  # memory is tight: admit nobody
        return step
    for seq in waiting:
        if budget == 0 or len(alive) + 1 > max_num_seqs:
            break
        n = min(seq.num_tokens - seq.num_computed, budget)
        need = blocks_to_grow(seq.num_computed, n, seq.num_blocks, block_size)
        if need > free:
            break
        free -= need
        budget -= n
        alive.append(seq)
        step.scheduled.append((seq.name, n))
    return step
