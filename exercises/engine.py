"""Your code runs the engine: ``python -m exercises engine``.

Every stage whose checks all pass lends its pieces to a real ``minipaged.LLM``, which then
serves the demo workload (copy prompts, half of them behind one shared preamble, prefix caching
on); the package's own code does the rest. The same workload through the package's engine alone
is the reference: every completion must be identical.

| stage | your piece | where it goes in the engine |
|---|---|---|
| 0 | ``kv_bytes_per_token`` | sizes the pool: a 1 MiB budget over your bytes per block |
| 1 | ``LifoPool``, ``fork`` | every block of the pool comes from your pool (LIFO order) |
| 2 | ``gather`` | reads each sequence's K/V for the prefill attention (else stage 3's ``gather_sequence_kv``) |
| 3 | ``decode_slot_mapping``, ``prefill_slot_mapping`` | the slots of every decode step and of every prefill from 0 |
| 4 | ``store_kvcache_kernel`` | writes every layer's new K/V into the cache (Triton) |
| 5 | ``schedule`` | decides every step: who runs, with how many tokens, who is preempted |
| 6 | ``chain_block_hashes`` | names every full block for the prefix cache |
| 7 | ``paged_decode_kernel`` | every decode step's attention (Triton) |

The engine is built by the package and then given these pieces through its seams: the pool of
the KV manager, an attention backend (:class:`minipaged.attention.backends.AttentionBackend`),
the scheduler, and, for the pure functions of stages 3 and 6, the module functions the engine
calls (:func:`plugged`). Each piece counts its calls, so the report says what your code did.
Triton runs in its interpreter on a CPU: the workload is kept small.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable, Iterator, MutableSequence
from collections.abc import Sequence as SequenceOf  # Sequence is the engine's
from types import ModuleType
from typing import Protocol
from unittest import mock

import torch

from exercises.stage4_triton import store_kvcache as launch_store
from exercises.stage7_capstone import paged_decode_attention as launch_decode
from minipaged import LLM, SamplingParams
from minipaged.attention import reference
from minipaged.attention.backends import TorchBackend
from minipaged.attention.batched import BatchPlan
from minipaged.attention.metadata import PagedMetadata
from minipaged.engine.batch import ScheduledBatch
from minipaged.engine.config import block_nbytes
from minipaged.engine.kv_manager import PagedKVManager
from minipaged.engine.scheduler import Scheduler
from minipaged.engine.sequence import Sequence, Status
from minipaged.kv import slot_mapping as package_slots
from minipaged.kv.block_pool import KVCacheBlock
from minipaged.model.config import ModelConfig
from minipaged.model.loader import EMBEDDED_MODEL_DIR
from minipaged.tiny import task

BLOCK_SIZE = 16
BUDGET = 1 << 20  # bytes of KV cache (stage 0 turns them into blocks)
NOT_YOURS = "the package's (your checks do not all pass yet)"
PIECES = {
    0: "kv_bytes_per_token",
    1: "LifoPool, fork",
    2: "gather",
    3: "decode_slot_mapping, prefill_slot_mapping",
    4: "store_kvcache_kernel",
    5: "schedule",
    6: "chain_block_hashes",
    7: "paged_decode_kernel",
}


def workload(num_prompts: int = 4, seed: int = 0) -> tuple[list[str], SamplingParams]:
    """The demo's copy prompts: half behind one shared preamble (so the prefix cache has hits)."""
    rng = random.Random(seed)
    preamble = "You are a careful copy machine. Repeat the text exactly. "
    texts = ["hello paged attention", "blocks like os pages"][:num_prompts]
    texts += [task.random_text(rng, 4, 16) for _ in range(num_prompts - len(texts))]
    prompts = [task.prompt_for(t, preamble if i % 2 == 0 else "") for i, t in enumerate(texts)]
    return prompts, SamplingParams(temperature=0, max_tokens=24)


class Stage1Pool(Protocol):
    """What the engine reads of your stage 1 pool (``TinyPool``'s names)."""

    free_list: MutableSequence[int]
    ref_cnt: list[int]

    def allocate(self, n: int) -> list[int]: ...
    def free(self, ids: list[int]) -> None: ...
    def share(self, block_id: int) -> None: ...


class _BlockView(KVCacheBlock):
    """A block of a learner's pool as the engine reads it: ``ref_cnt`` is the learner's count."""

    def __init__(self, pool: Stage1Pool, block_id: int) -> None:
        super().__init__(block_id)
        self._pool = pool

    @property
    def ref_cnt(self) -> int:
        return self._pool.ref_cnt[self.block_id]

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        pass  # the learner's pool keeps the count


class LearnerPool:
    """Stage 1's pool under the engine's ``BlockPool`` interface (prefix caching included: a
    cached free block is revived by taking it out of your free list, and evicted when your
    ``allocate`` hands it out again)."""

    def __init__(self, pool: Stage1Pool, num_blocks: int, calls: Counter) -> None:
        self.pool, self.calls, self.num_blocks = pool, calls, num_blocks
        self.blocks = [_BlockView(pool, i) for i in range(num_blocks)]
        self.on_evict: Callable[[KVCacheBlock], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self.pool.free_list)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def allocate(self, n: int) -> list[KVCacheBlock]:
        self.calls[1] += 1
        blocks: list[KVCacheBlock] = [self.blocks[i] for i in self.pool.allocate(n)]
        for block in blocks:
            if block.block_hash is not None:
                if self.on_evict is not None:
                    self.on_evict(block)
                block.block_hash = None
        return blocks

    def free(self, blocks: list) -> None:
        self.calls[1] += 1
        self.pool.free([b.block_id if isinstance(b, KVCacheBlock) else b for b in blocks])

    def share(self, block: KVCacheBlock | int) -> None:
        self.pool.share(block.block_id if isinstance(block, KVCacheBlock) else block)

    def touch(self, block: KVCacheBlock) -> None:
        if self.pool.ref_cnt[block.block_id] == 0:
            self.pool.free_list.remove(block.block_id)
        self.pool.ref_cnt[block.block_id] += 1


class LearnerBackend(TorchBackend):
    """The package's batched torch attention, with your store kernel (stage 4), your decode
    kernel (stage 7) and your gather for the prefill (stage 2, else stage 3) where you have them."""

    name = "yours"

    def __init__(self, parts: dict[int, ModuleType], calls: Counter) -> None:
        self.parts, self.calls = parts, calls
        self.gather_stage = 2 if 2 in parts else 3 if 3 in parts else None
        self.gather = {2: "gather", 3: "gather_sequence_kv"}.get(self.gather_stage or 0)

    def store_kvcache(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
    ) -> None:
        if 4 not in self.parts:
            return super().store_kvcache(key, value, k_cache, v_cache, slots)
        self.calls[4] += 1
        kernel = self.parts[4].store_kvcache_kernel  # your kernel, through the given launcher
        launch_store(key.contiguous(), value.contiguous(), k_cache, v_cache, slots, kernel=kernel)

    def decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedMetadata, plan: BatchPlan
    ) -> torch.Tensor:
        if 7 not in self.parts:
            return super().decode(q, k_cache, v_cache, meta, plan)
        self.calls[7] += 1
        kernel = self.parts[7].paged_decode_kernel
        return launch_decode(q.contiguous(), k_cache, v_cache, meta.block_tables, meta.context_lens, kernel=kernel)

    def prefill(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: PagedMetadata, plan: BatchPlan
    ) -> torch.Tensor:
        if self.gather_stage is None or self.gather is None:
            return super().prefill(q, k_cache, v_cache, meta, plan)
        self.calls[self.gather_stage] += 1
        gather = getattr(self.parts[self.gather_stage], self.gather)
        out = torch.empty_like(q)
        bounds = meta.cu_seqlens_q.tolist()
        for i, context_len in enumerate(meta.host_context_lens):
            k = gather(k_cache, meta.block_tables[i], context_len)
            v = gather(v_cache, meta.block_tables[i], context_len)
            out[bounds[i] : bounds[i + 1]] = reference.causal_attention(q[bounds[i] : bounds[i + 1]], k, v)
        return out


class LearnerScheduler(Scheduler):
    """Stage 5: your ``schedule`` decides each step; the package carries the decisions out."""

    def __init__(self, base: Scheduler, learner: ModuleType, calls: Counter) -> None:
        vars(self).update(vars(base))
        self.learner, self.calls = learner, calls

    def schedule(self) -> ScheduledBatch:
        batch = self.in_flight = ScheduledBatch(block_size=self.kv.table_block_size)
        self.calls[5] += 1
        names: dict[str, Sequence] = {f"R{s.seq_id}": s for s in [*self.running, *self.waiting]}
        for s in self.waiting:  # what the prefix cache gives a waiting sequence, before it is asked
            s.num_computed_tokens = s.num_cached_tokens = self.kv.match_prefix(s)

        def record(s: Sequence) -> object:
            return self.learner.Seq(f"R{s.seq_id}", len(s), s.num_computed_tokens, len(s.block_table.block_ids))

        assert isinstance(self.kv, PagedKVManager)  # build() makes a paged engine
        free = self.kv.pool.num_free_blocks
        step = self.learner.schedule(
            [record(s) for s in self.waiting], [record(s) for s in self.running], free,
            self.kv.table_block_size, self.max_num_seqs, self.max_num_batched_tokens,
        )  # fmt: skip
        for name in step.preempted:
            self._preempt([names[name]], batch)
        for name, n in step.scheduled:
            seq = names[name]
            if seq.status is Status.WAITING:
                self.waiting.remove(seq)
                self.num_prefix_hit_tokens += seq.num_computed_tokens
                self._start([seq])
            self._add_to_batch([seq], [n], batch)
        for s in self.waiting:  # not admitted: their hits go back
            self.kv.free(s)
            s.num_computed_tokens = s.num_cached_tokens = 0
        return batch


@contextlib.contextmanager
def plugged(parts: dict[int, ModuleType], calls: Counter) -> Iterator[None]:
    """Stages 3 and 6 are pure functions: the engine calls yours in place of the package's."""
    with contextlib.ExitStack() as stack:
        if 3 in parts:
            learner = parts[3]

            def slots(
                tables: SequenceOf[SequenceOf[int]],
                starts: SequenceOf[int],
                ends: SequenceOf[int],
                block_size: int,
                device: torch.device | str = "cpu",
            ) -> torch.Tensor:
                if all(e - s == 1 for s, e in zip(starts, ends)):
                    calls[3] += 1
                    return learner.decode_slot_mapping([list(t) for t in tables], list(ends), block_size).to(device)
                if not any(starts):
                    calls[3] += 1
                    ids = [list(t) for t in tables]
                    return learner.prefill_slot_mapping(ids, list(ends), block_size, pad_to=sum(ends)).to(device)
                return package_slots.build_slot_mapping(tables, starts, ends, block_size, device)

            stack.enter_context(mock.patch("minipaged.attention.metadata.build_slot_mapping", slots))
        if 6 in parts:
            hashes = parts[6].chain_block_hashes

            def chain(
                token_ids: SequenceOf[int], block_size: int, known: list[int] | None = None, extra_key: object = None
            ) -> list[int]:
                calls[6] += 1
                return hashes(list(token_ids), block_size)

            stack.enter_context(mock.patch("minipaged.engine.kv_manager.chain_hashes", chain))
        yield


def build(parts: dict[int, ModuleType], calls: Counter) -> LLM:
    """An engine with your pieces in it (the package's where ``parts`` has no stage)."""
    config = ModelConfig.from_json(EMBEDDED_MODEL_DIR / "config.json")
    if 0 in parts:
        per_block = BLOCK_SIZE * parts[0].kv_bytes_per_token(config, torch.float32)
        calls[0] += 1
    else:
        per_block = block_nbytes(config, BLOCK_SIZE, torch.float32)
    llm = LLM(block_size=BLOCK_SIZE, num_kvcache_blocks=BUDGET // per_block, max_num_seqs=8, enable_prefix_caching=True)
    kv = llm.kv_manager
    if 1 in parts:
        assert isinstance(kv, PagedKVManager) and kv.prefix_cache is not None  # paged, prefix caching on
        pool = LearnerPool(parts[1].LifoPool(llm.num_blocks), llm.num_blocks, calls)
        # The learner's pool stands in for the BlockPool: the same methods, not a subclass.
        vars(kv)["pool"] = vars(kv.prefix_cache)["pool"] = pool
        pool.on_evict = kv.prefix_cache._forget
        fork = parts[1].fork

        def learner_fork(parent: Sequence, child: Sequence) -> None:
            ids = fork(pool, parent.block_table.block_ids)
            child.block_table.add_blocks(ids, parent.block_table.num_tokens)
            child.block_hashes = list(parent.block_hashes)

        vars(kv)["fork"] = learner_fork  # your fork in place of the manager's, on this engine only
    if parts.keys() & {2, 3, 4, 7}:
        llm.runner.attn.backend = LearnerBackend(parts, calls)
    if 5 in parts:
        llm.scheduler = LearnerScheduler(llm.scheduler, parts[5], calls)
    return llm


def run(parts: dict[int, ModuleType], num_prompts: int = 4) -> tuple[int, int, Counter, list[str]]:
    """Serve the workload with ``parts`` plugged in and with the package alone. Returns (identical
    completions, prompts, calls per stage, your engine's completions)."""
    prompts, params = workload(num_prompts)
    want = [o.outputs[0].token_ids for o in LLM(block_size=BLOCK_SIZE).generate(prompts, params, use_tqdm=False)]
    calls: Counter = Counter()
    with plugged(parts, calls):
        llm = build(parts, calls)
        outs = llm.generate(prompts, params, use_tqdm=False)
    same = sum(o.outputs[0].token_ids == w for o, w in zip(outs, want))
    return same, len(prompts), calls, [o.outputs[0].text for o in outs]


def main(num_prompts: int = 4) -> int:
    from exercises import harness

    reports = harness.check(dict.fromkeys(PIECES))
    passed = {r.stage for r in reports if r.passed}
    parts = {s: harness.learner_module(s) for s in sorted(passed)}
    print(f"the demo workload: {num_prompts} copy prompts, prefix caching on (Triton runs in its interpreter)")
    same, total, calls, _ = run(parts, num_prompts)
    print("\nstage  your piece                                                         in the engine")
    for stage, piece in PIECES.items():
        where = f"yours ({calls[stage]} calls)" if stage in passed else NOT_YOURS
        print(f"  {stage}    {piece:<66} {where}")
    verdict = "identical to" if same == total else "DIFFERENT from"
    print(f"\n{same}/{total} completions {verdict} the package's engine, token for token")
    if not passed:
        print("none of your stages passes its checks yet: python -m exercises stageN says where you stand")
    return 0 if same == total else 1
