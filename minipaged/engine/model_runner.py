"""Run one scheduled batch through the model: pack it, describe it to attention, forward.

The runner owns the tensors: the KV cache it allocates at start-up (``kv_cache``: a paged pool
``[num_layers, num_blocks, block_size, kv_heads, head_dim]`` for K and for V, or stage 0's
contiguous slots), the attention that reads it, and each step's inputs. From the scheduled
sequences it packs

- ``input_ids``, ``positions``: int64 [num_tokens], every sequence's new tokens back to back;
- the attention metadata: ``slot_mapping`` [num_tokens], ``block_tables`` [num_seqs,
  max_blocks], ``context_lens`` [num_seqs], ``cu_seqlens_q`` [num_seqs + 1]
  (:class:`~minipaged.attention.cache_attention.PagedMetadata`), or for the contiguous cache
  the sequences' reservations;
- ``logits_indices`` [num_seqs]: each sequence's last new token, the only one whose logits
  are wanted.

Before the forward it carries out the copy-on-write block copies the KV manager asked for;
after it, :meth:`ModelRunner.sample` draws the next tokens (:mod:`minipaged.engine.sampler`).
"""

from __future__ import annotations

import itertools

import torch

from minipaged.attention.backends import get_ops
from minipaged.attention.cache_attention import ContiguousAttention, PagedAttention, PagedMetadata
from minipaged.engine.config import EngineConfig
from minipaged.engine.sampler import sample
from minipaged.engine.scheduler import ScheduledBatch
from minipaged.engine.sequence import Sequence
from minipaged.kv.contiguous import ContiguousKVCache
from minipaged.kv.paged_cache import PagedKVCache
from minipaged.model.decoder import DecoderModel


class ModelRunner:
    """``num_blocks`` blocks of ``cfg.block_size`` slots, laid out as ``cfg.kv_layout`` says."""

    def __init__(self, model: DecoderModel, cfg: EngineConfig, num_blocks: int, max_model_len: int) -> None:
        self.model = model
        mc, dtype, device = model.config, model.dtype, model.device
        shape = (mc.num_hidden_layers, num_blocks, cfg.block_size, mc.num_key_value_heads, mc.head_dim)
        ops = get_ops(cfg.attention_backend, device)
        self.kv_cache: PagedKVCache | ContiguousKVCache
        self.attn: PagedAttention | ContiguousAttention
        if cfg.kv_layout == "paged":
            self.kv_cache = PagedKVCache(*shape, dtype=dtype, device=device)
            self.attn = PagedAttention.of(self.kv_cache, ops)
            return
        num_slots = num_blocks * cfg.block_size  # the same memory, as max_model_len reservations
        if num_slots < max_model_len:
            raise ValueError(
                f"a contiguous cache of {num_slots} slots cannot hold one sequence of "
                f"max_model_len={max_model_len}: give more num_kvcache_blocks"
            )
        self.kv_cache = ContiguousKVCache(
            shape[0], *shape[3:], max_seq_len=max_model_len, num_slots=num_slots, dtype=dtype, device=device
        )
        self.attn = ContiguousAttention(self.kv_cache, ops)

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
        last = [end - 1 for end in itertools.accumulate(batch.q_lens)]
        return torch.tensor(input_ids, device=dev), positions.to(dev), torch.tensor(last, device=dev)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, copies: list[tuple[int, int]] = ()) -> torch.Tensor:
        """Copy the blocks owed for copy-on-write, then compute the batch's new tokens. Returns
        logits [num_seqs, vocab] at each sequence's last new token (meaningful only for
        sequences whose step reaches their last token)."""
        for src, dst in copies:
            self.kv_cache.copy_block(src, dst)
        input_ids, positions, last = self.prepare(batch)
        return self.model(input_ids, positions, self.attn, logits_indices=last)

    def sample(self, logits: torch.Tensor, rows_seqs: list[tuple[int, Sequence]]) -> list[int]:
        """One token per ``(row, seq)``: ``logits[row]`` drawn with that sequence's params and
        generator (forked samples share their parent's row)."""
        rows = [r for r, _ in rows_seqs]
        picked = logits if rows == list(range(len(logits))) else logits[rows]  # often every row
        return sample(picked, [s.params for _, s in rows_seqs], [s.generator for _, s in rows_seqs])
