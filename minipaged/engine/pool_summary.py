"""The KV pool as an observer sees it, read on request (:meth:`LLM.pool_summary
<minipaged.engine.llm.LLM.pool_summary>`): blocks per sequence, every block's ``ref_cnt``, which
blocks are cached, and the engine's figures (``kv_stats()``: hits, preemptions, swaps).

It copies the pool's state, so the engine never builds one on its own: whoever draws or
measures asks for one when it needs it (the server's projector a few times a second, a
notebook's drawing after each step). Nothing in it points back into the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SequenceState:
    """One unfinished sequence: where it is (``"running"``, ``"waiting"``, ``"swapped"``), the
    tokens it has in the cache, and its physical blocks (slots, for a contiguous cache)."""

    seq_id: int
    request_id: int
    sample_index: int
    status: str
    num_computed_tokens: int
    block_ids: list[int] = field(default_factory=list)


@dataclass
class PoolSummary:
    """``running`` (admission order), ``waiting`` (queue order), ``swapped``: the unfinished
    sequences; ``ref_cnt`` / ``cached``: per physical block (empty for a contiguous cache, which
    has no blocks to draw); ``stats``: :meth:`LLM.kv_stats <minipaged.engine.llm.LLM.kv_stats>`."""

    kv_layout: str
    num_blocks: int
    block_size: int
    num_free_blocks: int
    ref_cnt: list[int]
    cached: list[bool]
    running: list[SequenceState]
    waiting: list[SequenceState]
    swapped: list[SequenceState]
    stats: dict

    def blocks_per_request(self) -> dict[int, int]:
        """request id -> distinct blocks its running sequences hold (a shared block counts once)."""
        held: dict[int, set[int]] = {}
        for s in self.running:
            held.setdefault(s.request_id, set()).update(s.block_ids)
        return {r: len(b) for r, b in held.items()}
