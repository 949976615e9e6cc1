"""Run one scheduled batch through the model: pack the tokens, forward, return next-token logits."""

from __future__ import annotations

import torch

from minipaged.engine.block_manager import ContiguousKVManager, PagedKVManager
from minipaged.engine.scheduler import ScheduledBatch
from minipaged.model.decoder import DecoderModel


class ModelRunner:
    def __init__(self, model: DecoderModel, kv: PagedKVManager | ContiguousKVManager) -> None:
        self.model = model
        self.kv = kv

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> torch.Tensor:
        """Compute the batch's new tokens; returns logits [num_seqs, vocab] at each sequence's last
        new token (meaningful only for sequences whose step reaches their last token)."""
        dev = self.model.device
        input_ids: list[int] = []
        positions: list[int] = []
        for seq, n in zip(batch.seqs, batch.q_lens):
            start = seq.num_computed_tokens
            input_ids += seq.token_ids[start : start + n]
            positions += range(start, start + n)
        self.kv.prepare(batch.seqs, batch.q_lens)
        last = torch.tensor(batch.q_lens, device=dev).cumsum(0) - 1
        return self.model(
            torch.tensor(input_ids, device=dev),
            torch.tensor(positions, device=dev),
            self.kv.backend,
            logits_indices=last,
        )
