"""Stage 5 exercises: ``pick_victim``, ``blocks_to_grow``, ``num_admitted`` (notebook 05).

Checked against the package's real ``Scheduler`` and ``PagedKVManager``, driven without a model
(the schedule depends only on lengths).
"""

from __future__ import annotations

import random

import pytest

from minipaged.engine.block_manager import PagedKVManager
from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.scheduler import Scheduler
from minipaged.engine.sequence import Sequence, Status
from minipaged.kv.block_table import BlockTable
from minipaged.kv.slot_mapping import PagedKVCache

STAGE = "stage5_scheduler"


def manager(num_blocks: int, block_size: int) -> PagedKVManager:
    return PagedKVManager(PagedKVCache(1, num_blocks, block_size, 1, 1), False, "torch")


@pytest.fixture(scope="module")
def preemptions():
    """Notebook 05's workload on the real Scheduler: (running before the step, first preempted) per preemption.

    Eight prompts of 13-33 tokens, 12 new tokens each, 14 blocks of 8, at most 4 sequences. The
    loop does what ``LLM.step`` does after the model: count the computed tokens, append one token
    to each sequence that reached its end, finish those with 12 new tokens.
    """
    kv = manager(14, 8)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=2048)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for i, n in enumerate([13, 25, 20, 21, 33, 14, 9, 23]):
        scheduler.add(Sequence(i, list(range(n)), params, block_size=8))
    found, step = [], 0
    while scheduler.has_unfinished():
        step += 1
        before = list(scheduler.running)
        batch = scheduler.schedule()
        if batch.preempted:
            found.append((step, before, batch.preempted[0]))
        for seq, n in zip(batch.seqs, batch.q_lens):
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == len(seq):
                seq.token_ids.append(0)
                if seq.num_output_tokens >= params.max_tokens:
                    scheduler.finish(seq, "length")
    assert [s for s, _, _ in found] == [6, 21], "the notebook's schedule preempts at steps 6 and 21"
    return found


@pytest.mark.exercise("pick_victim")
def test_pick_victim_matches_scheduler(ex, preemptions):
    for step, running, victim in preemptions:
        got = ex.pick_victim(running)
        names = [f"R{s.request_id}" for s in running]
        assert isinstance(got, int) and 0 <= got < len(running), f"return an index into running, got {got!r}"
        assert running[got] is victim, (f"step {step}: running {names} (admission order); the scheduler preempted "
                                        f"R{victim.request_id}, you picked {names[got]}")


@pytest.mark.exercise("pick_victim")
def test_pick_victim_small_cases(ex):
    assert ex.pick_victim(["only"]) == 0
    assert ex.pick_victim(["oldest", "middle", "newest"]) == 2


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
        held = -(-computed // block_size)
        table = BlockTable.from_blocks(list(range(held)), computed, block_size)
        for new in range(0, 2 * block_size + 2):
            want = table.new_blocks_needed(new)
            got = ex.blocks_to_grow(computed, new, held, block_size)
            assert got == want, (f"{computed} tokens in {held} blocks of {block_size}, {new} new: "
                                 f"BlockTable.new_blocks_needed says {want}, got {got}")


@pytest.mark.exercise("blocks_to_grow")
def test_blocks_to_grow_matches_engine(ex):
    """PagedKVManager.blocks_needed on real sequences, grown by the manager step after step."""
    rng = random.Random(0)
    for block_size in (4, 16):
        kv = manager(64, block_size)
        seq = Sequence(0, list(range(200)), SamplingParams(), block_size)
        while seq.num_computed_tokens < len(seq):
            n = min(rng.choice([1, 1, 3, block_size, 2 * block_size + 1]), len(seq) - seq.num_computed_tokens)
            want = kv.blocks_needed(seq, n)
            got = ex.blocks_to_grow(seq.num_computed_tokens, n, len(seq.block_table.block_ids), block_size)
            held = len(seq.block_table.block_ids)
            assert got == want, (f"block size {block_size}: {seq.num_computed_tokens} computed, {held} blocks held, "
                                 f"{n} new: engine says {want}, got {got}")
            kv.allocate(seq, n)
            seq.num_computed_tokens += n


def engine_admits(waiting_lens, num_running, num_free_blocks, block_size, max_num_seqs, max_num_batched_tokens):
    """What the real Scheduler admits in one step from this state."""
    per_running = 2  # each running sequence holds block_size + 1 tokens: its decode needs no new block
    kv = manager(per_running * num_running + num_free_blocks + 1, block_size)
    kv.pool.allocate(1)  # one block held elsewhere, so that a pool is never empty
    scheduler = Scheduler(kv, max_num_seqs, max_num_batched_tokens)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i in range(num_running):
        seq = Sequence(i, list(range(block_size + 1)), params, block_size)
        kv.allocate(seq, len(seq))
        seq.num_computed_tokens = len(seq)
        seq.token_ids.append(0)  # its first sampled token, to be decoded this step
        seq.status = Status.RUNNING
        scheduler.running.append(seq)
    assert kv.pool.num_free_blocks == num_free_blocks
    for j, n in enumerate(waiting_lens):
        scheduler.add(Sequence(100 + j, list(range(n)), params, block_size))
    batch = scheduler.schedule()
    assert not batch.preempted
    return sum(s.request_id >= 100 for s in batch.seqs)


@pytest.mark.exercise("num_admitted")
def test_num_admitted_examples(ex):
    assert ex.num_admitted([10, 20, 5], 0, 10, 4, 8, 64) == 3
    assert ex.num_admitted([10, 20, 5], 0, 7, 4, 8, 64) == 1, "FIFO: the 5-token prompt waits behind the 20"
    assert ex.num_admitted([10, 20, 5], 3, 10, 4, 4, 64) == 1, "max_num_seqs=4 with 3 running"
    assert ex.num_admitted([10, 20], 2, 10, 4, 8, 16) == 2, "16 - 2 decodes = 14 tokens: 10, then a chunk of 4"
    assert ex.num_admitted([10, 20], 4, 10, 4, 8, 4) == 0, "the decodes took the whole budget"
    assert ex.num_admitted([], 0, 10, 4, 8, 64) == 0


@pytest.mark.exercise("num_admitted")
def test_num_admitted_matches_scheduler(ex):
    rng = random.Random(0)
    for _ in range(150):
        block_size = rng.choice([2, 4, 8, 16])
        max_num_seqs = rng.randint(1, 6)
        args = ([rng.randint(1, 40) for _ in range(rng.randint(0, 6))], rng.randint(0, max_num_seqs),
                rng.randint(0, 12), block_size, max_num_seqs, rng.choice([1, 3, 8, 16, 30, 64, 2048]))
        want = engine_admits(*args)
        got = ex.num_admitted(*args)
        assert got == want, ("num_admitted(waiting_lens={}, num_running={}, num_free_blocks={}, block_size={}, "
                             "max_num_seqs={}, max_num_batched_tokens={})".format(*args)
                             + f": the Scheduler admits {want}, got {got}")
