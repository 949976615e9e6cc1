"""Run one scheduled batch: move the blocks it asks for, pack its tokens, forward, sample.

The runner owns the tensors: the KV cache that the layout factory built
(:mod:`minipaged.engine.kv_layout`: ``[num_layers, num_blocks, block_size, kv_heads,
head_dim]`` for K and for V; the contiguous layout is the same with one slot per block), the
host pool that swapped blocks go to, the attention that reads the cache, and each step's inputs:

- ``input_ids``, ``positions``: int64 [num_tokens], every sequence's new tokens back to back;
- the attention metadata: ``slot_mapping`` [num_tokens], ``block_tables`` [num_seqs,
  max_blocks], ``context_lens`` [num_seqs], ``cu_seqlens_q`` [num_seqs + 1]
  (:class:`~minipaged.attention.metadata.PagedMetadata`);
- ``logits_indices`` [num_seqs]: each sequence's last new token, the only one whose logits
  are wanted.

:meth:`ModelRunner.run` is the step's one call into tensors: swaps out, swaps in, copy-on-write
copies, the forward (:meth:`forward`), then sampling (:mod:`minipaged.engine.sampler`).
"""

from __future__ import annotations

import itertools
from typing import cast

import torch

from minipaged.attention.cache_attention import PagedAttention
from minipaged.attention.metadata import PagedMetadata
from minipaged.engine.batch import SamplerOutput, ScheduledBatch
from minipaged.engine.sampler import sample, top_logprobs
from minipaged.engine.sampling_params import SamplingParams
from minipaged.kv.paged_cache import PagedKVCache
from minipaged.kv.slot_mapping import SlotMappingFn, build_slot_mapping
from minipaged.model.decoder import DecoderModel


class ModelRunner:
    """``slot_mapping`` builds each step's slots (``EnginePlugins.slot_mapping``)."""

    def __init__(
        self,
        model: DecoderModel,
        cache: PagedKVCache,
        attention: PagedAttention,
        host_cache: PagedKVCache | None,
        slot_mapping: SlotMappingFn = build_slot_mapping,
    ) -> None:
        self.model = model
        self.slot_mapping = slot_mapping
        self.kv_cache = cache
        self.attn = attention
        self.host_cache = host_cache

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pack the batch and hand its metadata to attention; returns input_ids, positions and
        logits_indices."""
        dev = self.model.device
        input_ids: list[int] = []
        for seq, start, n in zip(batch.seqs, batch.starts, batch.q_lens):
            input_ids += seq.token_ids[start : start + n]
        positions = [p for a, n in zip(batch.starts, batch.q_lens) for p in range(a, a + n)]
        meta = PagedMetadata.build(
            batch.block_tables, batch.starts, batch.q_lens, batch.block_size, dev, self.slot_mapping
        )
        self.attn.set_batch(meta)
        last = [end - 1 for end in itertools.accumulate(batch.q_lens)]
        return (
            torch.tensor(input_ids, device=dev),
            torch.tensor(positions, device=dev),
            torch.tensor(last, device=dev),
        )

    @torch.inference_mode()
    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """Compute the batch's new tokens. Returns logits [num_seqs, vocab] at each sequence's last
        new token (meaningful only for sequences whose step reaches their last token)."""
        input_ids, positions, last = self.prepare(batch)
        return self.model(input_ids, positions, self.attn, logits_indices=last)

    def run(self, batch: ScheduledBatch) -> SamplerOutput:
        """Move the blocks the batch asks for, then forward and sample every sampling row."""
        if batch.blocks_to_swap_out or batch.blocks_to_swap_in:
            assert self.host_cache is not None, "swapping needs the host pool of preemption_mode='swap'"
            if batch.blocks_to_swap_out:  # before anything can overwrite the freed device blocks
                self.kv_cache.copy_blocks(batch.blocks_to_swap_out, into=self.host_cache)
            if batch.blocks_to_swap_in:
                self.host_cache.copy_blocks(batch.blocks_to_swap_in, into=self.kv_cache)
        if batch.blocks_to_copy:
            self.kv_cache.copy_blocks(batch.blocks_to_copy)
        if not batch.seqs:
            return SamplerOutput()
        return self.sample(self.forward(batch), batch)

    def sample(self, logits: torch.Tensor, batch: ScheduledBatch) -> SamplerOutput:
        """One token per sampling row, ``logits[row]`` drawn with that sequence's params and
        generator (forked samples share their parent's row); a beam's candidates instead."""
        out = SamplerOutput()
        draws: list[tuple[int, int, SamplingParams, torch.Generator | None]] = []
        beams: list[tuple[int, int, int]] = []  # (sample, row, candidates wanted)
        for i, (row, seq) in enumerate(batch.samples):
            if seq.group.num_candidates:
                beams.append((i, row, seq.group.num_candidates))
            else:  # a group that draws one token a row samples with SamplingParams
                draws.append((i, row, cast(SamplingParams, seq.params), seq.generator))
        if draws:
            rows = [r for _, r, _, _ in draws]
            picked = logits if rows == list(range(len(logits))) else logits[rows]  # often every row
            out.token_ids = sample(picked, [p for _, _, p, _ in draws], [g for _, _, _, g in draws])
        if beams:
            cands = top_logprobs(logits[[r for _, r, _ in beams]], max(k for _, _, k in beams))
            out.candidates = {i: c[:k] for (i, _, k), c in zip(beams, cands)}
            drawn = iter(out.token_ids)  # token_ids stays indexed like batch.samples (-1: a beam's row)
            out.token_ids = [-1 if i in out.candidates else next(drawn) for i in range(len(batch.samples))]
        return out
