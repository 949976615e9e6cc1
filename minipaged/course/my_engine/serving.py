"""The learner's engine serves real chats: ``my_engine``'s pieces in the package's engine.

:func:`learner_engine` builds an :class:`~minipaged.engine.llm.LLM` whose pieces are the
learner's wherever their stage's check passes: the block pool (stage 1), the block tables' growth
(stage 2), the slot mapping, the
K/V write and paged attention (stage 3), the scheduler (stage 5), the block hashes, prefix hits,
forks and copy-on-write (stage 6). Only the model, the tokenizer and the engine's step itself
(schedule -> execute -> update, with its all-or-nothing transaction) are the package's. Each
piece goes in at the seam the engine leaves for it (:mod:`minipaged.course.my_engine.seams`).

In fp32, with greedy sampling, the learner's engine must answer every chat with the package's
tokens: :func:`compare` serves the same chats through both and says where they part. A piece
whose check does not pass yet stays the package's, and :class:`Pieces` says which and why, so
the engine runs at every point of the course.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from minipaged.course.my_engine.base import Result
from minipaged.course.my_engine.seams import (
    LearnerAttention,
    LearnerPool,
    learner_append_tokens,
    learner_block_hashes,
    learner_prefix_lookup,
    learner_scheduler,
    learner_slot_mapping,
)
from minipaged.engine.beam_search import BeamSearchParams
from minipaged.engine.llm import LLM
from minipaged.engine.plugins import EnginePlugins
from minipaged.engine.pool_summary import PoolSummary
from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.step_output import StepOutput
from minipaged.kv.block_pool import BlockPool
from minipaged.viz.pool import draw_pool
from minipaged.viz.pool_state import owners_from_tables

# piece -> (stage, the checks it needs)
PIECES: dict[str, tuple[int, tuple[str, ...]]] = {
    "block pool": (1, ("BlockPool: allocate, free, share", "BlockPool.touch")),
    "block tables": (2, ("BlockTable: append_tokens, physical",)),
    "slot mapping": (3, ("slot_mapping",)),
    "K/V write": (3, ("store_kv",)),
    "decode attention": (3, ("paged_decode_attention",)),
    "prefill attention": (3, ("paged_prefill_attention",)),
    "scheduler": (5, ("KVCacheManager: allocate_slots, free", "Scheduler: admission, continuous batching, preemption")),
    "block hashes": (6, ("block_hashes",)),
    "prefix hits": (6, ("block_hashes", "PrefixCache: cache_full_blocks, get_computed_blocks")),
    "fork, copy-on-write": (6, ("fork and copy_on_write",)),
}


@dataclass
class Pieces:
    """Whose each piece is: ``yours`` (piece -> stage), ``package`` (piece -> why not yours yet),
    and ``calls``, what the learner's code was called for since the engine was built."""

    yours: dict[str, int] = field(default_factory=dict)
    package: dict[str, str] = field(default_factory=dict)
    calls: Counter = field(default_factory=Counter)

    def report(self) -> str:
        lines = ["my_engine in the engine: the model and the tokenizer are the package's; the rest:"]
        for piece, (stage, _) in PIECES.items():
            whose = f"yours (stage {stage})" if piece in self.yours else f"the package's: {self.package[piece]}"
            lines.append(f"  {piece:20} {whose}")
        return "\n".join(lines)


def whose_pieces(results: dict[int, list[Result]]) -> Pieces:
    """Which pieces are the learner's, from the checks of every stage (``run(stage)``)."""
    pieces = Pieces()
    for piece, (stage, needs) in PIECES.items():
        status = {r.name: r for r in results.get(stage, [])}
        missing = [status[name] for name in needs if name in status and status[name].status != "pass"]
        if not missing and all(name in status for name in needs):
            pieces.yours[piece] = stage
        else:
            first = missing[0] if missing else None
            why = "not written yet" if first is None or first.status == "todo" else "its check fails"
            name = first.name if first else needs[0]
            pieces.package[piece] = f"{why} ({name}: python -m exercises my_engine {stage})"
    return pieces


class LearnerLLM(LLM):
    """An :class:`LLM` with the learner's pieces; ``pieces`` says whose each one is.

    The learner's scheduler runs one sequence per request: with it, ``n > 1`` and beam search
    are refused before anything is queued."""

    def __init__(self, pieces: Pieces, model: str | Path | None, plugins: EnginePlugins, **llm_args: Any) -> None:
        self.pieces = pieces
        super().__init__(model, plugins=plugins, **llm_args)

    def _add_many(self, prompts: list[Any], params: Any) -> list[int]:
        if "scheduler" in self.pieces.yours:
            for sp in params:
                if isinstance(sp, BeamSearchParams) or (isinstance(sp, SamplingParams) and sp.n > 1):
                    raise ValueError(
                        "my_engine's scheduler runs one sequence per request: ask for n=1 (no beam search), "
                        "or serve with the package's scheduler"
                    )
        return super()._add_many(prompts, params)


def learner_plugins(modules: dict[int, Any], pieces: Pieces) -> EnginePlugins:
    """The engine's seams filled with the learner's pieces (``modules``: stage -> the learner's module)."""
    yours, calls = pieces.yours, pieces.calls
    fields: dict[str, Any] = {}
    if "block pool" in yours:
        fields["block_pool"] = lambda n: LearnerPool(modules[1].BlockPool(n), calls)
    if "block tables" in yours:
        fields["append_tokens"] = learner_append_tokens(modules[2], calls)
    if "slot mapping" in yours:
        fields["slot_mapping"] = learner_slot_mapping(modules[3], calls)
    attention = {"store_kv": "K/V write", "decode": "decode attention", "prefill": "prefill attention"}
    mine = {k for k, piece in attention.items() if piece in yours}
    if mine:
        fields["attention_backend"] = LearnerAttention(modules[3], mine, calls)
    if "scheduler" in yours:
        pool_class = modules[1].BlockPool if "block pool" in yours else BlockPool
        fields["scheduler_policy"] = learner_scheduler(modules[5], pool_class, calls)
    if "block hashes" in yours:
        fields["block_hashes"] = learner_block_hashes(modules[6], calls)
    if "prefix hits" in yours:
        fields["prefix_lookup"] = learner_prefix_lookup(modules[6], calls)
    if "fork, copy-on-write" in yours:
        fields["fork"], fields["copy_on_write"] = modules[6].fork, modules[6].copy_on_write
    return EnginePlugins(**fields)


def learner_engine(model: str | Path | None, root: Path | None = None, **llm_args: Any) -> LearnerLLM:
    """The learner's engine over ``model`` (as :class:`LLM` takes it; ``llm_args`` too): every
    stage of ``root/my_engine`` (default: found from here) is checked, and each piece whose
    checks pass is plugged in. ``kv_layout`` is paged and preemption recomputes (the learner's
    scheduler frees a preempted request's blocks)."""
    from minipaged.course.my_engine import load, run  # the checks live beside this module's package

    results = {stage: run(stage, root=root) for stage in sorted({s for s, _ in PIECES.values()})}
    pieces = whose_pieces(results)
    modules = {stage: load(stage, root) for stage in {PIECES[p][0] for p in pieces.yours}}
    for name, value in (("kv_layout", "paged"), ("preemption_mode", "recompute"), ("plugins", None)):
        if llm_args.get(name, value) != value:
            raise ValueError(f"my_engine's engine is paged and recomputes what it preempts: {name}={llm_args[name]!r}")
    llm_args.pop("plugins", None)
    return LearnerLLM(pieces, model, learner_plugins(modules, pieces), **llm_args)


@dataclass
class Comparison:
    """The same chats through the learner's engine and the package's: the token ids of each answer,
    and ``fullest``, the learner's pool after the step that left it fullest (what an observer reads)."""

    yours: list[list[int]]
    package: list[list[int]]
    fullest: PoolSummary | None = None

    @property
    def first_difference(self) -> tuple[int, int] | None:
        """(chat, token) where the answers first differ, or None when every answer is the same."""
        for i, (a, b) in enumerate(zip(self.yours, self.package)):
            if a != b:
                return i, next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return None

    def draw_pool(self, title: str = "Your engine's pool, at its fullest") -> Figure:
        """The learner's pool at its fullest: each block coloured by the chats that hold it."""
        if self.fullest is None:
            raise ValueError("no step ran: nothing to draw")
        tables: dict[str, list[int]] = {}
        for seq in self.fullest.running:
            tables.setdefault(f"chat {seq.request_id}", []).extend(seq.block_ids)
        return draw_pool(self.fullest.ref_cnt, owners_from_tables(tables), cached=self.fullest.cached, title=title)


def compare(learner: LLM, package: LLM, conversations: list[Any], max_tokens: int = 24) -> Comparison:
    """Both engines answer ``conversations`` (greedy, at most ``max_tokens`` each). While the
    learner's engine runs, an observer (:meth:`LLM.subscribe`, asking for the pool) keeps the
    pool each step left, when it has fewer free blocks than any before: it reads what the step
    hands back and changes nothing."""
    fullest: list[PoolSummary] = []

    def keep_fullest(step: StepOutput) -> None:
        if step.pool is not None and (not fullest or step.pool.num_free_blocks < fullest[0].num_free_blocks):
            fullest[:] = [step.pool]

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    learner.subscribe(keep_fullest, pool=True)
    try:
        yours = [list(o.outputs[0].token_ids) for o in learner.chat(conversations, params, use_tqdm=False)]
    finally:
        learner.unsubscribe(keep_fullest)
    theirs = [list(o.outputs[0].token_ids) for o in package.chat(conversations, params, use_tqdm=False)]
    return Comparison(yours, theirs, fullest[0] if fullest else None)
