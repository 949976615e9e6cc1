"""Stage 5 exercises: ``blocks_to_grow`` and ``schedule`` (notebook 05).

``schedule`` is checked on hand-made states, against the package's decisions on notebook 05's
workload (recorded below: the exercise's interface is its own, so these checks never touch the
engine's classes), and against the reference solution on random states.
"""

from __future__ import annotations

import copy
import random

import pytest

from exercises.stage5_scheduler import Seq, Step
from minipaged.kv.block_table import BlockTable
from minipaged.utils import cdiv

STAGE = "stage5_scheduler"


@pytest.mark.exercise("blocks_to_grow")
def test_blocks_to_grow_examples(ex):
    assert ex.blocks_to_grow(0, 20, 0, 16) == 2, "a 20-token prompt from scratch"
    assert ex.blocks_to_grow(24, 1, 2, 16) == 0, "decode into the half-empty second block"
    assert ex.blocks_to_grow(32, 1, 2, 16) == 1, "both blocks full: token 33 starts a third"
    assert ex.blocks_to_grow(10, 50, 1, 16) == 3, "a chunk of 50 after 10: 60 tokens need 4 blocks"
    assert ex.blocks_to_grow(5, 0, 1, 16) == 0
    assert ex.blocks_to_grow(0, 32, 0, 16) == 2, "32 tokens fill exactly 2 blocks"


@pytest.mark.exercise("blocks_to_grow")
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_blocks_to_grow_matches_block_table(ex, block_size):
    for computed in range(0, 3 * block_size + 2):
        held = cdiv(computed, block_size)
        table = BlockTable.from_blocks(list(range(held)), computed, block_size)
        for new in range(0, 2 * block_size + 2):
            want = table.new_blocks_needed(new)
            got = ex.blocks_to_grow(computed, new, held, block_size)
            assert got == want, (
                f"{computed} tokens in {held} blocks of {block_size}, {new} new: "
                f"BlockTable.new_blocks_needed says {want}, got {got}"
            )


def show(step: Step) -> str:
    """A step as one line: ``R0:13 R1:1 | preempt R3``."""
    if not isinstance(step, Step):
        return f"{step!r} (return a Step)"
    text = " ".join(f"{name}:{n}" for name, n in step.scheduled) or "(nothing)"
    return text + (" | preempt " + " ".join(step.preempted) if step.preempted else "")


def state(waiting: list[Seq], running: list[Seq], free_blocks: int) -> str:
    def seqs(queue: list[Seq]) -> str:
        return ", ".join(f"{s.name} {s.num_computed}/{s.num_tokens} tokens {s.num_blocks} blocks" for s in queue)

    return f"running [{seqs(running)}], waiting [{seqs(waiting)}], {free_blocks} free blocks"


def check_step(ex, want: str, waiting, running, free_blocks, block_size=4, max_num_seqs=8, budget=64) -> None:
    args = (waiting, running, free_blocks, block_size, max_num_seqs, budget)
    frozen = copy.deepcopy(args)
    got = ex.schedule(*args)
    limits = f"block size {block_size}, max_num_seqs {max_num_seqs}, budget {budget}"
    where = f"{state(waiting, running, free_blocks)}, {limits}"
    assert show(got) == want, f"{where}:\n  want {want}\n  got  {show(got)}"
    assert args == frozen, "do not change the arguments: work on copies"


def prompt(name: str, n: int) -> Seq:
    return Seq(name, n)


def decoding(name: str, num_tokens: int, block_size: int = 4) -> Seq:
    """A running sequence about to decode its last sampled token."""
    return Seq(name, num_tokens, num_tokens - 1, cdiv(num_tokens - 1, block_size))


@pytest.mark.exercise("schedule")
def test_schedule_admission(ex):
    prompts = [prompt("A", 10), prompt("B", 20), prompt("C", 5)]
    check_step(ex, "A:10 B:20 C:5", prompts, [], 10)
    check_step(ex, "A:10", prompts, [], 7)  # 20 tokens need 5 blocks, 4 are left; C waits behind B (FIFO)
    check_step(ex, "A:10 B:20", prompts, [], 10, max_num_seqs=2)
    check_step(ex, "(nothing)", [], [], 10)
    check_step(ex, "(nothing)", prompts, [], 2)  # A needs 3 blocks


@pytest.mark.exercise("schedule")
def test_schedule_running_first_and_chunks(ex):
    running = [decoding("R0", 9), decoding("R1", 12)]  # R0's token 9 starts a 3rd block, R1's 12 fits its 3rd
    check_step(ex, "R0:1 R1:1 A:10 B:4", [prompt("A", 10), prompt("B", 20)], running, 20, budget=16)
    check_step(ex, "R0:1 R1:1 A:10", [prompt("A", 10)], running, 20, max_num_seqs=3)
    check_step(ex, "R0:1 R1:1", [prompt("A", 10)], running, 20, max_num_seqs=2)
    check_step(ex, "R0:1", [prompt("A", 10)], running, 20, budget=1)  # the budget ends before R1
    half = Seq("P", 30, 12, 3)  # a prompt prefilled in chunks: 12 of 30 computed
    check_step(ex, "P:8", [], [half], 10, budget=8)
    check_step(ex, "P:18 A:2", [prompt("A", 10)], [half], 10, budget=20)


@pytest.mark.exercise("schedule")
def test_schedule_preemption(ex):
    running = [decoding("R0", 9), decoding("R1", 13), decoding("R2", 5)]  # each needs one new block
    check_step(ex, "R0:1 R1:1 R2:1", [], running, 3)
    check_step(ex, "R0:1 R1:1 | preempt R2", [prompt("A", 1)], running, 1)  # R2's block goes to R1
    check_step(ex, "R0:1 | preempt R2 R1", [], running, 0)
    check_step(ex, "(nothing) | preempt R0", [], running[:1], 0)  # the only one: preempted itself
    big = [decoding("R0", 5), Seq("R1", 40, 4, 1), decoding("R2", 9)]  # R1 asks for 36 tokens: 9 more blocks
    check_step(ex, "R0:1 | preempt R2 R1", [prompt("A", 1)], big, 6)  # nobody is admitted after a preemption


class Workload:
    """Drives a ``schedule`` step after step, doing the rest of an engine step itself.

    After each step: the scheduled sequences compute their tokens, one that reached its end samples
    a token (it finishes with ``max_tokens`` of them, freeing its blocks), and preempted ones go
    back to the front of the waiting queue with nothing computed and no blocks. Every decision is
    checked for what a real pool allows first.
    """

    def __init__(self, prompts, max_tokens, num_blocks, block_size, max_num_seqs, budget) -> None:
        self.waiting = [Seq(f"R{i}", n) for i, n in enumerate(prompts)]
        self.running: list[Seq] = []
        self.free = num_blocks
        self.limits = (block_size, max_num_seqs, budget)
        self.outputs = {s.name: 0 for s in self.waiting}
        self.max_tokens = max_tokens

    def apply(self, step: Step, where: str) -> None:
        block_size, max_num_seqs, budget = self.limits
        for name in step.preempted:
            victim = next((s for s in self.running if s.name == name), None)
            assert victim is not None, f"{where}: preempted {name}, which is not running"
            self.running.remove(victim)
            self.free += victim.num_blocks
            victim.num_computed = victim.num_blocks = 0
            self.waiting.insert(0, victim)
        tokens = 0
        for name, n in step.scheduled:
            seq = next((s for s in self.running + self.waiting if s.name == name), None)
            assert seq is not None, f"{where}: scheduled {name}, which is neither running nor waiting"
            missing = seq.num_tokens - seq.num_computed
            assert 1 <= n <= missing, f"{where}: {name} has {missing} tokens to compute, you scheduled {n}"
            grow = cdiv(seq.num_computed + n, block_size) - seq.num_blocks
            assert grow <= self.free, f"{where}: {name}:{n} needs {grow} new blocks, only {self.free} are free"
            if seq in self.waiting:
                assert seq is self.waiting[0], f"{where}: admitted {name} ahead of {self.waiting[0].name} (FIFO)"
                self.waiting.remove(seq)
                self.running.append(seq)
            self.free -= max(grow, 0)
            seq.num_blocks += max(grow, 0)
            seq.num_computed += n
            tokens += n
        assert tokens <= budget, f"{where}: {tokens} tokens scheduled, the budget is {budget}"
        assert len(self.running) <= max_num_seqs, f"{where}: {len(self.running)} running, at most {max_num_seqs}"
        for seq in list(self.running):
            if seq.num_computed == seq.num_tokens:  # the step's logits give its next token
                self.outputs[seq.name] += 1
                seq.num_tokens += 1
                if self.outputs[seq.name] == self.max_tokens:
                    self.running.remove(seq)
                    self.free += seq.num_blocks

    def run(self, schedule, want: list[str]) -> None:
        block_size, max_num_seqs, budget = self.limits
        for number, line in enumerate(want, start=1):
            before = state(self.waiting, self.running, self.free)
            step = schedule(self.waiting, self.running, self.free, block_size, max_num_seqs, budget)
            assert show(step) == line, (
                f"step {number}, {before}:\n  the package's scheduler: {line}\n  yours:                    {show(step)}"
            )
            self.apply(step, f"step {number}")
        left = state(self.waiting, self.running, self.free)
        assert not (self.waiting or self.running), f"after {len(want)} steps everything should be done: {left}"


def expand(text: str) -> list[str]:
    """The recorded steps, one per line; ``x5`` at the end of a line repeats it."""
    steps = []
    for line in text.strip().splitlines():
        body, _, times = line.partition(" x")
        steps += [body.strip()] * (int(times) if times else 1)
    return steps


# The package's Scheduler on notebook 05's workload: prompts of 13-33 tokens, 12 new tokens each,
# 14 blocks of 8, at most 4 sequences. Recorded from minipaged.engine.scheduler.Scheduler.
NOTEBOOK_05 = """
R0:13 R1:25 R2:20 R3:21
R0:1 R1:1 R2:1 R3:1 x4
R0:1 R1:1 R2:1 | preempt R3
R0:1 R1:1 R2:1 x6
R3:26 R4:33 R5:14 R6:9
R3:1 R4:1 R5:1 R6:1 x6
R4:1 R5:1 R6:1 R7:23
R4:1 R5:1 R6:1 | preempt R7
R4:1 R5:1 R6:1 x3
R7:24
R7:1 x10
"""

# The same with max_num_batched_tokens=16: prompts are prefilled in chunks, and R3 and R7 are
# preempted twice in a row (memory is too tight for four sequences).
NOTEBOOK_05_CHUNKED = """
R0:13 R1:3
R0:1 R1:15
R0:1 R1:7 R2:8
R0:1 R1:1 R2:12 R3:2
R0:1 R1:1 R2:1 R3:13
R0:1 R1:1 R2:1 R3:6
R0:1 R1:1 R2:1 R3:1 x3
R0:1 R1:1 R2:1 | preempt R3
R0:1 R1:1 R2:1 R3:13
R0:1 R1:1 R2:1 | preempt R3
R1:1 R2:1 R3:14
R1:1 R2:1 R3:11 R4:3
R2:1 R3:1 R4:14
R3:1 R4:15
R3:1 R4:1 R5:14
R3:1 R4:1 R5:1 R6:9
R3:1 R4:1 R5:1 R6:1 x3
R4:1 R5:1 R6:1 R7:13
R4:1 R5:1 R6:1 R7:10
R4:1 R5:1 R6:1 R7:1
R4:1 R5:1 R6:1 | preempt R7
R4:1 R5:1 R6:1 R7:13
R4:1 R5:1 R6:1 | preempt R7
R4:1 R5:1 R6:1
R6:1 R7:15
R7:10
R7:1 x9
"""

NOTEBOOK_PROMPTS = [13, 25, 20, 21, 33, 14, 9, 23]


@pytest.mark.exercise("schedule")
@pytest.mark.parametrize("budget,recorded", [(2048, NOTEBOOK_05), (16, NOTEBOOK_05_CHUNKED)], ids=["whole", "chunked"])
def test_schedule_notebook_workload(ex, budget, recorded):
    want = expand(recorded)
    Workload(NOTEBOOK_PROMPTS, 12, 14, 8, 4, budget).run(ex.schedule, want)


def random_state(rng: random.Random, block_size: int):
    """Running sequences (decoding, or mid-prefill) with the blocks they hold, a waiting queue, free blocks."""
    running = []
    for i in range(rng.randint(0, 5)):
        total = rng.randint(2, 40)
        computed = total - 1 if rng.random() < 0.7 else rng.randint(1, total - 1)  # decoding, or mid-prefill
        running.append(Seq(f"R{i}", total, computed, cdiv(computed, block_size)))
    waiting = [Seq(f"W{j}", rng.randint(1, 40)) for j in range(rng.randint(0, 5))]
    return waiting, running, rng.randint(0, 12)


@pytest.mark.exercise("schedule")
def test_schedule_matches_reference_on_random_states(ex, reference):
    rng = random.Random(0)
    for _ in range(300):
        block_size = rng.choice([1, 2, 4, 8, 16])
        waiting, running, free = random_state(rng, block_size)
        max_num_seqs = rng.randint(max(1, len(running)), 8)
        budget = rng.choice([1, 3, 8, 16, 30, 64, 2048])
        want = show(
            reference.schedule(copy.deepcopy(waiting), copy.deepcopy(running), free, block_size, max_num_seqs, budget)
        )
        check_step(ex, want, waiting, running, free, block_size, max_num_seqs, budget)
