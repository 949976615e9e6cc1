"""Faults injected into a real engine, and the checks that a failed step left no trace.

- :func:`fail_in_layer` makes the next forward raise in one attention layer, before or after
  that layer stored its K/V (so a layer may have written into the cache when the step fails);
- :func:`fail_in_sampling` makes the next sampling raise, before or after the draws were made;
- :func:`check_pool` checks the block pools against the sequences that hold blocks, and that
  every running sequence's block table covers exactly its computed tokens;
- :func:`watch_forks` checks every fork as it happens: the sample shares all of its parent's
  blocks, and they cover the parent's computed tokens;
- :func:`check_cached_kv` compares the K/V every running sequence holds in the cache with the
  K/V a no-cache forward of its tokens computes.
"""

from __future__ import annotations

from collections import Counter

import torch

from minipaged import LLM
from minipaged.attention.reference import gather_kv, varlen_attention
from minipaged.engine.kv_manager import PagedKVManager
from minipaged.engine.sequence import Status


class Boom(RuntimeError):
    """The injected error."""


def fail_in_layer(llm: LLM, layer: int, after_store: bool, exc: type[BaseException] = Boom) -> None:
    """The next forward raises ``exc`` in ``layer`` (once), before or after its K/V store."""
    attn = llm.runner.attn
    original = attn.attend

    def attend(i, q, k, v):
        if i != layer:
            return original(i, q, k, v)
        del attn.attend  # once
        if after_store:
            original(i, q, k, v)
        raise exc(f"injected in layer {i} ({'after' if after_store else 'before'} its store)")

    attn.attend = attend


def fail_in_sampling(llm: LLM, after_draw: bool, exc: type[BaseException] = Boom) -> None:
    """The next sampling raises ``exc`` (once), before or after drawing (seeded generators advanced)."""
    runner = llm.runner
    original = runner.sample

    def sample(*args):
        del runner.sample
        if after_draw:
            original(*args)
        raise exc("injected in sampling")

    runner.sample = sample


def holders(llm: LLM) -> list:
    s = llm.scheduler
    return list(s.running) + [q for unit in s.swapped for q in unit]


def check_pool(llm: LLM) -> None:
    """Between steps: every block's ref_cnt is the number of block tables naming it, waiting
    sequences hold nothing, and the free queue agrees with the counts (device and host)."""
    kv = llm.kv_manager
    if not isinstance(kv, PagedKVManager):
        return
    s = llm.scheduler
    assert all(not q.block_table.block_ids for q in s.waiting), "a waiting sequence holds blocks"
    for pool, seqs in (
        (kv.pool, s.running),
        (kv.host_pool, [q for unit in s.swapped for q in unit]),
    ):
        if pool is None:
            continue
        pool.check_invariants()
        counts = Counter(b for q in seqs for b in q.block_table.block_ids)
        for block in pool.blocks:
            assert block.ref_cnt == counts.get(block.block_id, 0), f"block {block.block_id}: {block.ref_cnt} refs"
    for q in s.running:
        assert q.status is Status.RUNNING and q.block_table.num_tokens == q.num_computed_tokens, q


class ForkWatch:
    """Counts the forks of ``llm`` and checks each as it happens (see :func:`watch_forks`)."""

    def __init__(self) -> None:
        self.forks = 0


def watch_forks(llm: LLM) -> ForkWatch:
    """Wrap the paged KV manager's ``fork``: after it, the child's block table is the parent's
    (same block ids, same token count), every shared block has one more reference, and the
    table covers the parent's computed tokens, so a forked sample never starts without K/V."""
    watch = ForkWatch()
    kv = llm.kv_manager
    if not isinstance(kv, PagedKVManager):
        return watch
    original = kv.fork

    def fork(parent, child):
        before = {b: kv.pool.blocks[b].ref_cnt for b in parent.block_table.block_ids}
        original(parent, child)
        table = parent.block_table
        assert table.num_tokens == parent.num_computed_tokens > 0, f"forking from {parent} with no K/V"
        assert child.block_table.block_ids == table.block_ids, (child, parent)
        assert child.block_table.num_tokens == table.num_tokens, (child, parent)
        for b, n in before.items():
            assert kv.pool.blocks[b].ref_cnt == n + 1, f"block {b} not shared by the fork"
        watch.forks += 1

    kv.fork = fork
    return watch


class _Capture:
    """No-cache attention that keeps each layer's K/V: [num_tokens, num_kv_heads, head_dim]."""

    def __init__(self, n: int) -> None:
        self.cu = torch.tensor([0, n], dtype=torch.int32)
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def attend(self, layer, q, k, v):
        self.k[layer], self.v[layer] = k.clone(), v.clone()
        return varlen_attention(q, k, v, self.cu)


@torch.inference_mode()
def check_cached_kv(llm: LLM, atol: float = 1e-4) -> int:
    """Every running sequence's cached K/V equal a no-cache forward's; returns the tokens checked."""
    cache, checked = llm.runner.kv_cache, 0
    for seq in llm.scheduler.running:
        n = seq.num_computed_tokens
        if n == 0:
            continue
        cap = _Capture(n)
        llm.model(torch.tensor(seq.token_ids[:n]), torch.arange(n), cap)
        table = torch.tensor(list(llm.kv_manager.block_ids(seq, n)))
        for layer in cap.k:
            got_k = gather_kv(cache.k[layer], table, n)
            got_v = gather_kv(cache.v[layer], table, n)
            torch.testing.assert_close(got_k, cap.k[layer], atol=atol, rtol=1e-4)
            torch.testing.assert_close(got_v, cap.v[layer], atol=atol, rtol=1e-4)
        checked += n
    return checked
