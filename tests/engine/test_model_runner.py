"""The model runner on its own, on the embedded tiny model: how a batch is packed, the block
moves it makes before the forward, and how sampled rows map to sequences.

Batches are built by hand, with block tables from a fresh :class:`PagedKVManager`, so each test
knows exactly which blocks of the runner's cache it touches; the scheduler is not involved.
"""

from __future__ import annotations

import pytest
import torch
from rows import add_row

from minipaged import LLM, SamplingParams
from minipaged.attention.reference import gather_kv, varlen_attention
from minipaged.engine.beam_search import BeamGroup
from minipaged.engine.kv_manager import PagedKVManager
from minipaged.engine.model_runner import ModelRunner, sample, top_logprobs
from minipaged.engine.request_group import SampleGroup
from minipaged.engine.sampling_params import BeamSearchParams
from minipaged.engine.scheduler_output import SchedulerOutput
from minipaged.engine.sequence import Sequence
from minipaged.engine.step_transaction import StepTransaction

BS = 4
NUM_BLOCKS = 16
GREEDY = SamplingParams(temperature=0, max_tokens=8)


@pytest.fixture(scope="module")
def llm():
    return LLM(block_size=BS, num_kvcache_blocks=NUM_BLOCKS, max_model_len=64, preemption_mode="swap")


@pytest.fixture
def runner(llm):
    """The engine's runner with zeroed device and host caches."""
    r = llm.runner
    for cache in (r.kv_cache, r.host_cache):
        cache.k.zero_()
        cache.v.zero_()
    return r


def seq(tokens, params=GREEDY) -> Sequence:
    if isinstance(params, BeamSearchParams):
        return BeamGroup(0, None, list(tokens), params, BS, eos_token_ids=()).seqs[0]
    return SampleGroup(0, None, list(tokens), params, BS).seqs[0]


def prompt(llm, text: str) -> list[int]:
    return llm.tokenizer.encode(text)


def compute(runner, kv, rows, copies=()):
    """One step: room for each ``(seq, n)`` of ``rows``, one batch, run; the tokens count as computed."""
    tx = StepTransaction(BS)
    batch = tx.batch
    batch.blocks_to_copy += list(copies)
    for s, n in rows:
        kv.allocate_slots(s, n, tx)
        add_row(tx, s, n, kv.block_ids(s, s.num_computed_tokens + n))
    out = runner.run(batch)
    for s, n in rows:
        s.num_computed_tokens += n
    return batch, out


class Capture:
    """No-cache attention that keeps each layer's K/V: [num_tokens, num_kv_heads, head_dim]."""

    def __init__(self, n: int) -> None:
        self.cu = torch.tensor([0, n], dtype=torch.int32)
        self.k, self.v = {}, {}

    def attend(self, layer, q, k, v):
        self.k[layer], self.v[layer] = k.clone(), v.clone()
        return varlen_attention(q, k, v, self.cu)


@torch.inference_mode()
def no_cache(llm, token_ids):
    """(logits of every position, the captured K/V) of a whole-sequence forward without a cache."""
    cap = Capture(len(token_ids))
    logits = llm.model(torch.tensor(token_ids), torch.arange(len(token_ids)), cap)
    return logits, cap


def assert_cache_holds(llm, runner, s: Sequence):
    """The cache holds, through ``s``'s block table, the K/V a no-cache forward computes."""
    n = s.num_computed_tokens
    _, cap = no_cache(llm, s.token_ids[:n])
    table = torch.tensor(s.block_table.block_ids)
    for layer in cap.k:
        torch.testing.assert_close(gather_kv(runner.kv_cache.k[layer], table, n), cap.k[layer], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(gather_kv(runner.kv_cache.v[layer], table, n), cap.v[layer], atol=1e-4, rtol=1e-4)


# -- prepare -------------------------------------------------------------------------------
def test_prepare_packs_a_chunk_from_mid_prompt_and_a_decode_row(runner):
    chunked = seq(range(10, 20))  # 10 tokens; 4 already computed, this step brings tokens 4..7
    chunked.num_computed_tokens = 4
    decoding = seq([30, 31, 32, 33, 34])
    decoding.token_ids.append(35)  # its first sampled token, at position 5
    decoding.num_computed_tokens = 5
    tx = StepTransaction(BS)
    batch = tx.batch
    add_row(tx, chunked, 4, [3, 7])
    add_row(tx, decoding, 1, [5, 6])
    input_ids, positions, logits_indices = runner.prepare(batch)
    assert input_ids.tolist() == [14, 15, 16, 17, 35]
    assert positions.tolist() == [4, 5, 6, 7, 5]
    assert logits_indices.tolist() == [3, 4]  # each row's last new token
    assert input_ids.dtype == positions.dtype == torch.int64
    meta = runner.attn.meta
    assert meta.slot_mapping.tolist() == [28, 29, 30, 31, 25]  # block 7 offsets 0-3, block 6 offset 1
    assert meta.block_tables.tolist() == [[3, 7], [5, 6]]
    assert meta.context_lens.tolist() == [8, 6]
    assert meta.cu_seqlens_q.tolist() == [0, 4, 5]
    assert meta.host_q_lens == [4, 1] and meta.host_context_lens == [8, 6]  # a mixed step


def test_prepare_pads_ragged_block_tables(runner):
    a, b = seq(range(1, 10)), seq([1, 2])
    tx = StepTransaction(BS)
    batch = tx.batch
    add_row(tx, a, 9, [4, 2, 9])
    add_row(tx, b, 2, [11])
    input_ids, positions, logits_indices = runner.prepare(batch)
    assert input_ids.tolist() == [*range(1, 10), 1, 2]
    assert positions.tolist() == [*range(9), 0, 1]
    assert logits_indices.tolist() == [8, 10]
    assert runner.attn.meta.block_tables.tolist() == [[4, 2, 9], [11, 0, 0]]
    assert runner.attn.meta.slot_mapping.tolist() == [16, 17, 18, 19, 8, 9, 10, 11, 36, 44, 45]


def test_a_prompt_in_chunks_and_a_decode_row_give_the_no_cache_logits(llm, runner):
    kv = PagedKVManager(NUM_BLOCKS, BS, False)
    a = seq(prompt(llm, "abc<copy>hello<end>"))  # 10 tokens: the copy model answers "hello"
    b = seq(prompt(llm, "xy<copy>ab<end>"))
    compute(runner, kv, [(a, 5), (b, len(b))])  # a's first chunk; b's whole prompt samples
    b.token_ids.append(ord("a"))
    tx = StepTransaction(BS)
    batch = tx.batch
    for s, n in ((a, len(a) - 5), (b, 1)):
        kv.allocate_slots(s, n, tx)
        add_row(tx, s, n, kv.block_ids(s, s.num_computed_tokens + n))
    assert batch.decode == [False, True] and batch.starts == [5, len(b) - 1]
    logits = runner.forward(batch)
    for row, s in enumerate((a, b)):
        want, _ = no_cache(llm, s.token_ids)
        torch.testing.assert_close(logits[row], want[-1], atol=1e-4, rtol=1e-4)
    assert [logits[0].argmax().item(), logits[1].argmax().item()] == [ord("h"), ord("b")]


# -- run: block moves before the forward ---------------------------------------------------
def fill(runner):
    """Distinct values in every slot of the device and host caches; returns copies of them."""
    g = torch.Generator().manual_seed(0)
    for cache in (runner.kv_cache, runner.host_cache):
        cache.k.copy_(torch.randn(cache.k.shape, generator=g))
        cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    return [t.clone() for t in (runner.kv_cache.k, runner.kv_cache.v, runner.host_cache.k, runner.host_cache.v)]


def test_run_makes_the_copy_on_write_copies(runner):
    k, v, hk, hv = fill(runner)
    batch = SchedulerOutput(block_size=BS, blocks_to_copy=[(1, 9), (4, 3)])
    out = runner.run(batch)
    assert out.token_ids == [] and out.candidates == {}  # nothing to forward
    want_k, want_v = k.clone(), v.clone()
    want_k[:, 9], want_v[:, 9] = k[:, 1], v[:, 1]
    want_k[:, 3], want_v[:, 3] = k[:, 4], v[:, 4]
    assert torch.equal(runner.kv_cache.k, want_k) and torch.equal(runner.kv_cache.v, want_v)
    assert torch.equal(runner.host_cache.k, hk) and torch.equal(runner.host_cache.v, hv)


def test_run_swaps_out_before_it_swaps_in(runner):
    k, v, hk, hv = fill(runner)
    # device block 2 goes to host block 0 while host block 1 comes back into device block 2
    batch = SchedulerOutput(block_size=BS, blocks_to_swap_out=[(2, 0), (5, 3)], blocks_to_swap_in=[(1, 2)])
    runner.run(batch)
    want_hk, want_hv = hk.clone(), hv.clone()
    want_hk[:, 0], want_hv[:, 0] = k[:, 2], v[:, 2]
    want_hk[:, 3], want_hv[:, 3] = k[:, 5], v[:, 5]
    want_k, want_v = k.clone(), v.clone()
    want_k[:, 2], want_v[:, 2] = hk[:, 1], hv[:, 1]
    assert torch.equal(runner.host_cache.k, want_hk) and torch.equal(runner.host_cache.v, want_hv)
    assert torch.equal(runner.kv_cache.k, want_k) and torch.equal(runner.kv_cache.v, want_v)


def test_swapping_without_a_host_pool_is_refused(llm):
    bare = ModelRunner(llm.model, llm.runner.kv_cache, llm.runner.attn, None)
    with pytest.raises(AssertionError, match="swapping needs the host pool of preemption_mode='swap'"):
        bare.run(SchedulerOutput(block_size=BS, blocks_to_swap_in=[(0, 1)]))


def test_a_copy_on_write_copy_is_made_before_the_forward_writes_the_new_token(llm, runner):
    kv = PagedKVManager(NUM_BLOCKS, BS, False)
    parent = seq(prompt(llm, "xy<copy>ab<end>"))  # 6 tokens: blocks [0, 1], block 1 holds 2
    child = seq(parent.token_ids)
    _, out = compute(runner, kv, [(parent, len(parent))])
    assert out.token_ids == [ord("a")]
    kv.fork(parent, child)
    child.num_computed_tokens = parent.num_computed_tokens
    parent.token_ids.append(ord("a"))
    child.token_ids.append(ord("x"))  # a sample that drew another token
    batch, out = compute(runner, kv, [(parent, 1), (child, 1)])
    assert batch.blocks_to_copy == [(1, 2)]  # the parent writes first: it copies block 1 into block 2
    assert parent.block_table.block_ids == [0, 2] and child.block_table.block_ids == [0, 1]
    k = runner.kv_cache.k
    assert len(parent) == 7
    assert torch.equal(k[:, 2, :2], k[:, 1, :2])  # the prompt's tokens 4-5, copied
    assert not torch.equal(k[:, 2, 2], k[:, 1, 2])  # then each wrote its own token at position 6
    for s in (parent, child):
        assert_cache_holds(llm, runner, s)
    want = [no_cache(llm, s.token_ids)[0][-1].argmax().item() for s in (parent, child)]
    assert out.token_ids == want and want[0] == ord("b")


# -- sample --------------------------------------------------------------------------------
def logits_with_argmax(*best, vocab=20):
    rows = torch.zeros(len(best), vocab)
    for r, b in enumerate(best):
        rows[r, b] = 5.0
        rows[r, (b + 1) % vocab] = 3.0
    return rows


def test_forked_samples_draw_from_their_parents_row(runner):
    logits = logits_with_argmax(5, 9)
    params = SamplingParams(n=3, max_tokens=4, seed=7, top_k=2)  # row 0 gives 5 or 6, row 1 9 or 10
    family = SampleGroup(0, None, [1, 2, 3], params, BS).seqs
    other = seq([4, 5])
    tx = StepTransaction(BS)
    batch = tx.batch
    add_row(tx, other, 2, [0])
    add_row(tx, family[0], 3, [1])
    assert [row for row, _ in batch.samples] == [0, 1, 1, 1]
    # what each sample's own stream draws from row 1 alone, on copies of the generators
    copies = [torch.Generator().manual_seed(0) for _ in family]
    for c, s in zip(copies, family):
        c.set_state(s.generator.get_state())
    want = [sample(logits[1:2], [params], [c])[0] for c in copies]
    out = runner.sample(logits, batch)
    assert set(want) <= {9, 10}
    assert out.token_ids == [5, *want] and out.candidates == {}


def test_only_sampling_rows_are_read(runner):
    logits = logits_with_argmax(5, 9, 13)
    chunk, done = seq(range(1, 10)), seq([1, 2])
    tx = StepTransaction(BS)
    batch = tx.batch
    add_row(tx, chunk, 4, [0])  # a chunk that does not reach its last token: no sample
    add_row(tx, done, 2, [2])
    add_row(tx, seq([3]), 1, [3])
    assert runner.sample(logits, batch).token_ids == [9, 13]


def test_a_beams_row_gives_candidates(runner):
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(3))
    logits[0, 4] = 10.0
    beam = seq([1, 2, 3], params=BeamSearchParams(beam_width=2, max_tokens=4))
    tx = StepTransaction(BS)
    batch = tx.batch
    add_row(tx, seq([7]), 1, [0])
    add_row(tx, beam, 3, [1])
    add_row(tx, seq([8, 9]), 2, [2])
    out = runner.sample(logits, batch)
    assert out.token_ids == [4, -1, logits[2].argmax().item()]  # -1 holds the beam's place
    assert list(out.candidates) == [1]
    cands = out.candidates[1]
    assert len(cands) == 4  # 2 x beam_width
    assert [t for t, _ in cands] == torch.topk(logits[1], 4).indices.tolist()
    want = torch.log_softmax(logits[1], -1)
    assert [lp for _, lp in cands] == pytest.approx([want[t].item() for t, _ in cands], abs=1e-6)
    assert cands == top_logprobs(logits[1:2], 4)[0]


def test_a_batch_of_beams_alone_gives_only_candidates(runner):
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(4))
    narrow = seq([1], params=BeamSearchParams(beam_width=1, max_tokens=4))
    wide = seq([2], params=BeamSearchParams(beam_width=3, max_tokens=4))
    tx = StepTransaction(BS)
    batch = tx.batch
    add_row(tx, narrow, 1, [0])
    add_row(tx, wide, 1, [1])
    out = runner.sample(logits, batch)
    assert out.token_ids == [-1, -1]
    assert [len(out.candidates[i]) for i in (0, 1)] == [2, 6]  # each its own 2 x beam_width
    assert [t for t, _ in out.candidates[0]] == torch.topk(logits[0], 2).indices.tolist()
