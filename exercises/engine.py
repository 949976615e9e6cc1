"""Your code runs the engine: ``python -m exercises engine``.

Every stage whose checks all pass lends its pieces to a real ``minipaged.LLM``, which then
serves the demo workload (copy prompts, half of them behind one shared preamble, prefix caching
on, steps of at most 64 tokens so that long prompts are prefilled in chunks, and one prompt
asking for ``n=2`` samples, which fork and copy on write); the package's own code does the rest.
The same workload through the package's engine alone is the reference: every completion must be
identical.

| stage | your piece | ``EnginePlugins`` field: where it runs in the engine |
|---|---|---|
| 0 | ``kv_bytes_per_token`` | (none) sizes the pool: a 1 MiB budget over your bytes per block |
| 1 | ``LifoPool``, ``fork`` | ``block_pool``: every block (LIFO order); ``fork``: samples share a prompt's blocks |
| 2 | ``gather`` | ``attention_backend``: reads each sequence's K/V for the prefill attention |
| 3 | ``decode_slot_mapping``, ``prefill_slot_mapping`` | ``slot_mapping``: the slots of every step, of every kind |
| 4 | ``store_kvcache_kernel`` | ``attention_backend``: writes every layer's new K/V into the cache (Triton) |
| 5 | ``schedule`` | ``scheduler_policy``: decides every step: who runs, how many tokens, who is preempted |
| 6 | ``chain_block_hashes`` | ``block_hashes``: names every full block for the prefix cache |
| 6 | ``reusable_prefix_tokens`` | ``prefix_lookup``: how many tokens of each new prompt the cache gives |
| 6 | ``copy_on_write`` | ``copy_on_write``: a sample's first write into a block it shares |
| 7 | ``paged_decode_kernel`` | ``attention_backend``: every decode step's attention (Triton) |

Stage 2's ``gather`` (else stage 3's ``gather_sequence_kv``) reads K/V for the prefill. Stage 3's
slots cover every kind of step: decodes, whole prompts, chunks of a long prompt, the rest of a
prompt after a prefix hit, and batches that mix them.

The engine is built with these pieces through :class:`minipaged.engine.plugins.EnginePlugins`
(``LLM(plugins=...)``), the same seam the package's own pieces go through. Each piece counts its
calls (``calls[stage]``, and ``calls[stage, what]`` by kind of call or step), so the report says
what your code did. Triton runs in its interpreter on a CPU: the workload is kept small.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from types import ModuleType

import torch

from exercises.adapters import (
    LearnerBackend,
    LearnerPool,
    learner_block_hashes,
    learner_copy_on_write,
    learner_fork,
    learner_policy,
    learner_prefix_lookup,
    learner_slot_mapping,
)
from minipaged import LLM, SamplingParams
from minipaged.engine.config import block_nbytes
from minipaged.engine.plugins import EnginePlugins
from minipaged.kv.block_pool import KVBlockPool
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
    6: "chain_block_hashes, reusable_prefix_tokens, copy_on_write",
    7: "paged_decode_kernel",
}
MAX_NUM_BATCHED_TOKENS = 64  # the demo's step budget: its longer prompts are prefilled in chunks


def workload(num_prompts: int = 4, seed: int = 0) -> tuple[list[str], list[SamplingParams]]:
    """The demo's copy prompts: half behind one shared preamble (so the prefix cache has hits),
    the second asking for two samples (greedy, so both copy the text; they fork from the prompt)."""
    rng = random.Random(seed)
    preamble = "You are a careful copy machine. Repeat the text exactly. "
    texts = ["hello paged attention", "blocks like os pages"][:num_prompts]
    texts += [task.random_text(rng, 4, 16) for _ in range(num_prompts - len(texts))]
    prompts = [task.prompt_for(t, preamble if i % 2 == 0 else "") for i, t in enumerate(texts)]
    params = [SamplingParams(temperature=0, max_tokens=24, n=2 if i == 1 else 1) for i in range(num_prompts)]
    return prompts, params


# -- stage 1: your pool as the engine's block pool ---------------------------------------------
def plugins_for(parts: dict[int, ModuleType], calls: Counter) -> EnginePlugins:
    """The engine's plug-in points filled with your pieces (the package's where ``parts`` has no stage)."""
    plugins = EnginePlugins()
    if 1 in parts:
        learner_pool = parts[1].LifoPool

        def block_pool(n: int) -> KVBlockPool:
            return LearnerPool(learner_pool(n), n, calls)

        plugins = dataclasses.replace(plugins, block_pool=block_pool, fork=learner_fork(parts[1], calls))
    if 3 in parts:
        plugins = dataclasses.replace(plugins, slot_mapping=learner_slot_mapping(parts[3], calls))
    if 5 in parts:
        plugins = dataclasses.replace(plugins, scheduler_policy=learner_policy(parts[5], calls))
    if 6 in parts:
        plugins = dataclasses.replace(
            plugins,
            block_hashes=learner_block_hashes(parts[6], calls),
            prefix_lookup=learner_prefix_lookup(parts[6], calls),
            copy_on_write=learner_copy_on_write(parts[6], calls),
        )
    if parts.keys() & {2, 3, 4, 7}:
        plugins = dataclasses.replace(plugins, attention_backend=LearnerBackend(parts, calls))
    return plugins


def build(
    parts: dict[int, ModuleType],
    calls: Counter,
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
    num_kvcache_blocks: int | None = None,
) -> LLM:
    """An engine with your pieces in it (the package's where ``parts`` has no stage); a pool of
    ``num_kvcache_blocks`` instead of the 1 MiB budget's."""
    config = ModelConfig.from_json(EMBEDDED_MODEL_DIR / "config.json")
    if 0 in parts:
        per_block = BLOCK_SIZE * parts[0].kv_bytes_per_token(config, torch.float32)
        calls[0] += 1
    else:
        per_block = block_nbytes(config, BLOCK_SIZE, torch.float32)
    num_blocks = num_kvcache_blocks or BUDGET // per_block
    return LLM(
        block_size=BLOCK_SIZE, num_kvcache_blocks=num_blocks, max_num_seqs=8, enable_prefix_caching=True,
        max_num_batched_tokens=max_num_batched_tokens, plugins=plugins_for(parts, calls),
    )  # fmt: skip


def serve(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> list[list[list[int]]]:
    """Every completion's token ids, per request."""
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]


def run(
    parts: dict[int, ModuleType],
    num_prompts: int = 4,
    requests: tuple[list[str], list[SamplingParams]] | None = None,
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
    num_kvcache_blocks: int | None = None,
) -> tuple[int, int, Counter, list[str]]:
    """Serve the workload (or ``requests``) with ``parts`` plugged in and with the package alone.
    Returns (requests whose every completion is identical, requests, calls per stage, your
    engine's first completion of each request)."""
    prompts, params = requests or workload(num_prompts)
    want = serve(build({}, Counter(), max_num_batched_tokens, num_kvcache_blocks), prompts, params)
    calls: Counter = Counter()
    llm = build(parts, calls, max_num_batched_tokens, num_kvcache_blocks)
    outs = llm.generate(prompts, params, use_tqdm=False)
    same = sum([c.token_ids for c in o.outputs] == w for o, w in zip(outs, want))
    return same, len(prompts), calls, [o.outputs[0].text for o in outs]


def main(num_prompts: int = 4) -> int:
    from exercises import harness

    reports = harness.check(dict.fromkeys(PIECES))
    passed = {r.stage for r in reports if r.passed}
    parts = {s: harness.learner_module(s) for s in sorted(passed)}
    print(
        f"the demo workload: {num_prompts} copy prompts, prefix caching on, steps of at most "
        f"{MAX_NUM_BATCHED_TOKENS} tokens (Triton runs in its interpreter)"
    )
    same, total, calls, _ = run(parts, num_prompts)
    print("\nstage  your piece                                                         in the engine")
    for stage, piece in PIECES.items():
        where = f"yours ({calls[stage]} calls)" if stage in passed else NOT_YOURS
        print(f"  {stage}    {piece:<66} {where}")
    verdict = "identical to" if same == total else "DIFFERENT from"
    print(f"\n{same}/{total} requests' completions {verdict} the package's engine, token for token")
    if not passed:
        print("none of your stages passes its checks yet: python -m exercises stageN says where you stand")
    return 0 if same == total else 1
