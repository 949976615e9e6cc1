"""Run one scheduled batch through the model: pack it, describe it to attention, forward.

The runner owns the step's tensors. From the scheduled sequences it packs

- ``input_ids``, ``positions``: int64 [num_tokens], every sequence's new tokens back to back;
- the attention metadata: ``slot_mapping`` [num_tokens], ``block_tables`` [num_seqs,
  max_blocks], ``context_lens`` [num_seqs], ``cu_seqlens_q`` [num_seqs + 1]
  (:class:`~minipaged.attention.cache_attention.PagedMetadata`), or for the contiguous cache
  the sequences' reservations;
- ``logits_indices`` [num_seqs]: each sequence's last new token, the only one whose logits
  are wanted.

Before the forward it carries out the copy-on-write block copies the KV manager asked for.
"""

from __future__ import annotations

import torch

from minipaged.attention.cache_attention import ContiguousAttention, PagedAttention, PagedMetadata
from minipaged.engine.scheduler import ScheduledBatch
from minipaged.kv.slot_mapping import PagedKVCache
from minipaged.model.decoder import DecoderModel


class ModelRunner:
    def __init__(
        self, model: DecoderModel, attn: PagedAttention | ContiguousAttention, kv_cache: PagedKVCache | None = None
    ) -> None:
        self.model = model
        self.attn = attn
        self.kv_cache = kv_cache  # the paged tensors, for copy-on-write (None for the contiguous cache)

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pack the batch and hand its metadata to attention; returns input_ids, positions and
        logits_indices."""
        dev = self.model.device
        starts = [s.num_computed_tokens for s in batch.seqs]
        input_ids: list[int] = []
        for seq, start, n in zip(batch.seqs, starts, batch.q_lens):
            input_ids += seq.token_ids[start : start + n]
        positions = torch.tensor([p for a, n in zip(starts, batch.q_lens) for p in range(a, a + n)])
        if isinstance(self.attn, PagedAttention):
            tables = [s.block_table.block_ids for s in batch.seqs]
            block_size = batch.seqs[0].block_table.block_size
            self.attn.set_batch(PagedMetadata.build(tables, starts, batch.q_lens, block_size, dev))
        else:
            ends = [a + n for a, n in zip(starts, batch.q_lens)]
            self.attn.set_batch([s.seq_id for s in batch.seqs], batch.q_lens, ends)
        last = torch.tensor(batch.q_lens).cumsum(0) - 1
        return torch.tensor(input_ids, device=dev), positions.to(dev), last.to(dev)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, copies: list[tuple[int, int]] = ()) -> torch.Tensor:
        """Copy the blocks owed for copy-on-write, then compute the batch's new tokens. Returns
        logits [num_seqs, vocab] at each sequence's last new token (meaningful only for
        sequences whose step reaches their last token)."""
        for src, dst in copies:
            self.kv_cache.copy_block(src, dst)
        input_ids, positions, last = self.prepare(batch)
        return self.model(input_ids, positions, self.attn, logits_indices=last)
