"""Helpers for the vLLM V1 conformance tests: a small engine on the embedded model, one step seen
through its batch, and the pool's free-queue order.

Every engine shares one loaded copy of the embedded model (its weights are never written, and the
KV cache, the pool and the scheduler are each engine's own): loading it is most of the cost of an
``LLM``, and these tests build about forty. The loader is replaced only while an engine is built.

The tests drive the public engine (``LLM.add_request``, ``LLM.run_step``, ``LLM.abort_request``,
``LLM.get_output``, ``LLM.kv_stats``) and read the block pool it runs on (``LLM.kv_manager.pool``,
a :class:`~minipaged.kv.block_pool.BlockPool`). Prompts are token ids below 256 (the embedded
model's byte vocabulary), so no tokenizer is involved unless a test says so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import minipaged.engine.llm as llm_module
from minipaged import LLM, SamplingParams
from minipaged.kv.block_pool import BlockPool
from minipaged.model.loader import load_model

BS = 16  # vLLM's test block size, and minipaged's default
# vLLM's tests use prompts of three full blocks holding 0, 1, 2 (then a partial block).
COMMON = [i for i in range(3) for _ in range(BS)]


@functools.cache
def _embedded_model(dtype: Any, device: Any) -> tuple[Any, Any]:
    return load_model(None, dtype=dtype, device=device)


def _shared_load(path: Any = None, dtype: Any = None, device: Any = None) -> tuple[Any, Any]:
    assert path is None, "only the embedded model is shared"
    return _embedded_model(dtype, str(device))


def make_llm(**kwargs: Any) -> LLM:
    """``LLM(**kwargs)`` on the embedded model (shared, see the module docstring)."""
    with mock.patch.object(llm_module, "load_model", _shared_load):
        return LLM(**kwargs)


def engine(num_blocks: int, caching: bool = True, **kwargs: Any) -> LLM:
    """The embedded tiny model with a pool of exactly ``num_blocks`` blocks (no null block)."""
    kwargs.setdefault("max_model_len", 256)
    return make_llm(num_kvcache_blocks=num_blocks, enable_prefix_caching=caching, **kwargs)


def greedy(max_tokens: int, **kwargs: Any) -> SamplingParams:
    """Greedy and deaf to EOS unless told otherwise: a schedule that depends only on lengths."""
    kwargs.setdefault("ignore_eos", True)
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def pool_of(llm: LLM) -> BlockPool:
    pool = llm.kv_manager.pool
    assert isinstance(pool, BlockPool)
    return pool


def free_order(llm_or_pool: LLM | BlockPool) -> list[int]:
    """Block ids in the free queue, the next one handed out first."""
    pool = llm_or_pool if isinstance(llm_or_pool, BlockPool) else pool_of(llm_or_pool)
    return [b.block_id for b in pool.free_queue]


@dataclass
class Step:
    """What one engine step did, by request id."""

    scheduled: dict[int, int] = field(default_factory=dict)  # tokens computed
    tables: dict[int, list[int]] = field(default_factory=dict)  # block table the step wrote through
    sampled: list[int] = field(default_factory=list)  # requests that drew a token
    preempted: list[int] = field(default_factory=list)


def step(llm: LLM) -> Step:
    batch, _ = llm.run_step()
    out = Step()
    for seq, n, table in zip(batch.seqs, batch.q_lens, batch.block_tables):
        out.scheduled[seq.request_id] = n
        out.tables[seq.request_id] = list(table)
    out.sampled = [seq.request_id for _, seq in batch.samples]
    out.preempted = [seq.request_id for seq in batch.preempted]
    return out


def run_to_end(llm: LLM) -> list[Step]:
    steps = []
    while llm.has_unfinished_requests():
        steps.append(step(llm))
    return steps
