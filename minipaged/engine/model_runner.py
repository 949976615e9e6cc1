"""Run one scheduled batch: move the blocks it asks for, pack its tokens, forward, sample.

The runner owns the tensors: the KV cache that the layout factory built
(:mod:`minipaged.engine.kv_layout`: ``[num_layers, num_blocks, block_size, kv_heads,
head_dim]`` for K and for V; the contiguous layout is the same with one slot per block), the
host pool that swapped blocks go to, the attention that reads the cache, and each step's inputs:

- ``input_ids``, ``positions``: int64 [num_tokens], every sequence's new tokens back to back;
- the attention metadata: ``slot_mapping`` [num_tokens], ``block_tables`` [num_seqs,
  max_blocks], ``context_lens`` [num_seqs], ``cu_seqlens_q`` [num_seqs + 1]
  (:class:`~minipaged.attention.cache_attention.PagedMetadata`);
- ``logits_indices`` [num_seqs + num_prompt_rows]: each sequence's last new token, then the
  prompt rows whose logits score prompt tokens (``prompt_logprobs``; see
  :mod:`~minipaged.engine.logprobs`): no other row's logits are wanted.

:meth:`ModelRunner.execute_model` (vLLM's name; ``run`` is the same) is the step's one call into
tensors: it takes the step's :class:`~minipaged.engine.scheduler_output.SchedulerOutput` and
returns its :class:`~minipaged.engine.runner_output.ModelRunnerOutput`: swaps out, swaps in,
copy-on-write copies, the forward (:meth:`forward`), then sampling (below). It times its phases
into the output's ``seconds`` (attention too, through :class:`TimedAttention`), so that nobody
needs to patch it to see where a step's time goes.

**Sampling** turns the batch's next-token logits into tokens, one call for the whole batch
(:func:`sample`). Greedy rows take one ``argmax``. The other rows are filtered together: divide
by each row's temperature, sort once, keep each row's ``top_k`` best and the smallest head of
the sorted distribution whose mass reaches its ``top_p``, then draw by inverse CDF: a uniform
number ``u`` per row picks the first token whose cumulative probability exceeds ``u``.

Each seeded sequence draws its ``u`` from its own ``torch.Generator``, exactly one number per
sampled token, so its tokens are the same whether it runs alone or batched, and after a
preemption (tokens already drawn are kept, not redrawn).

A beam does not draw: :func:`top_logprobs` gives its ``k`` most likely next tokens with their
log-probabilities (log-softmax of the raw logits, in fp32), and the beam search chooses.

A drawn token whose request asked for ``logprobs`` is then scored from the same row of raw
logits (:func:`~minipaged.engine.logprobs.score`); the prompt rows after the sampling rows score
prompt tokens (:func:`~minipaged.engine.logprobs.prompt_logprobs`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import cast

import torch

from minipaged.attention.cache_attention import PagedAttention, PagedMetadata
from minipaged.engine.logprobs import TokenLogprobs, prompt_logprobs, prompt_rows, score
from minipaged.engine.runner_output import ModelRunnerOutput
from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.scheduler_output import SchedulerOutput
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
        self.device = model.device
        self.slot_mapping = slot_mapping
        self.kv_cache = cache
        self.attn = attention
        self.host_cache = host_cache
        self.seconds: dict[str, float] = {}  # the phases of the step in flight (ModelRunnerOutput.seconds)

    def prepare(self, batch: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pack the batch and hand its metadata to attention; returns input_ids, positions and
        logits_indices."""
        dev = self.device
        input_ids: list[int] = []
        for seq, start, n in zip(batch.seqs, batch.starts, batch.q_lens):
            input_ids += seq.token_ids[start : start + n]
        positions = [p for a, n in zip(batch.starts, batch.q_lens) for p in range(a, a + n)]
        meta = PagedMetadata.build(
            batch.block_tables, batch.starts, batch.q_lens, batch.block_size, dev, self.slot_mapping
        )
        self.attn.set_batch(meta)
        rows = [end - 1 for end in itertools.accumulate(batch.q_lens)]  # each row's last new token
        if batch.prompt_logprobs:
            rows += prompt_rows(batch.q_lens, batch.starts, batch.prompt_logprobs)
        return (
            torch.tensor(input_ids, device=dev),
            torch.tensor(positions, device=dev),
            torch.tensor(rows, device=dev),
        )

    @torch.inference_mode()
    def forward(self, batch: SchedulerOutput) -> torch.Tensor:
        """Compute the batch's new tokens. Returns logits [num_seqs + num_prompt_rows, vocab]: at
        each sequence's last new token (meaningful only for sequences whose step reaches their
        last token), then at the prompt rows that ``batch.prompt_logprobs`` scores. The time of
        ``prepare``, ``forward`` and, inside it, ``attention`` goes to the step's ``seconds``."""
        seconds = self.seconds
        start = time.perf_counter()
        input_ids, positions, logits_indices = self.prepare(batch)
        mid = time.perf_counter()
        logits = self.model(input_ids, positions, TimedAttention(self.attn, seconds), logits_indices=logits_indices)
        seconds["prepare"], seconds["forward"] = mid - start, time.perf_counter() - mid
        return logits

    def execute_model(self, batch: SchedulerOutput) -> ModelRunnerOutput:
        """Move the blocks the batch asks for, then forward, sample every sampling row and score
        the prompt tokens the batch asks to."""
        return self.run(batch)

    def run(self, batch: SchedulerOutput) -> ModelRunnerOutput:
        """:meth:`execute_model`."""
        if batch.blocks_to_swap_out or batch.blocks_to_swap_in:
            assert self.host_cache is not None, "swapping needs the host pool of preemption_mode='swap'"
            if batch.blocks_to_swap_out:  # before anything can overwrite the freed device blocks
                self.kv_cache.copy_blocks(batch.blocks_to_swap_out, into=self.host_cache)
            if batch.blocks_to_swap_in:
                self.host_cache.copy_blocks(batch.blocks_to_swap_in, into=self.kv_cache)
        if batch.blocks_to_copy:
            self.kv_cache.copy_blocks(batch.blocks_to_copy)
        if not batch.seqs:
            return ModelRunnerOutput()
        seconds = self.seconds = {"attention": 0.0}  # this step's: forward and sample add theirs
        logits = self.forward(batch)
        start = time.perf_counter()
        num_seqs = len(batch.seqs)
        out = self.sample(logits[:num_seqs], batch)
        if batch.prompt_logprobs:
            out.prompt_logprobs = prompt_logprobs(
                logits[num_seqs:], batch.prompt_logprobs, [s.token_ids for s in batch.seqs]
            )
        seconds["sample"] = time.perf_counter() - start
        out.seconds = seconds
        return out

    def sample(self, logits: torch.Tensor, batch: SchedulerOutput) -> ModelRunnerOutput:
        """One token per sampling row, ``logits[row]`` drawn with that sequence's params and
        generator (forked samples share their parent's row); a beam's candidates instead."""
        out = ModelRunnerOutput()
        draws: list[tuple[int, int, SamplingParams, torch.Generator | None]] = []
        beams: list[tuple[int, int, int]] = []  # (sample, row, candidates wanted)
        for i, ((row, seq), k) in enumerate(zip(batch.samples, batch.candidates)):
            if k:
                beams.append((i, row, k))
            else:  # a group that draws one token a row samples with SamplingParams
                draws.append((i, row, cast(SamplingParams, seq.params), seq.generator))
        if draws:
            rows = [r for _, r, _, _ in draws]
            picked = logits if rows == list(range(len(logits))) else logits[rows]  # often every row
            out.token_ids = sample(picked, [p for _, _, p, _ in draws], [g for _, _, _, g in draws])
            out.logprobs = drawn_logprobs(picked, out.token_ids, draws)
        if beams:
            cands = top_logprobs(logits[[r for _, r, _ in beams]], max(k for _, _, k in beams))
            out.candidates = {i: c[:k] for (i, _, k), c in zip(beams, cands)}
            drawn = iter(out.token_ids)  # token_ids stays indexed like batch.samples (-1: a beam's row)
            out.token_ids = [-1 if i in out.candidates else next(drawn) for i in range(len(batch.samples))]
        return out


class TimedAttention:
    """The runner's attention as the model sees it, adding each layer's ``attend`` time to
    ``seconds["attention"]`` (the KV write and the attention itself)."""

    def __init__(self, attn: PagedAttention, seconds: dict[str, float]) -> None:
        self.attn, self.seconds = attn, seconds
        self.seconds.setdefault("attention", 0.0)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        try:
            return self.attn.attend(layer, q, k, v)
        finally:
            self.seconds["attention"] += time.perf_counter() - start


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> list[int]:
    """logits: [num_rows, vocab] (fp32); params and generators: one per row -> one token id per row."""
    num_rows, vocab = logits.shape
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if len(greedy) == num_rows:  # the common case: one argmax, nothing to gather
        return logits.argmax(-1).tolist()
    tokens = torch.empty(num_rows, dtype=torch.long)
    if greedy:
        tokens[greedy] = logits[greedy].argmax(-1).cpu()
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        tokens[rows] = _sample_rows(
            logits[rows].float(), [params[i] for i in rows], [generators[i] for i in rows], vocab
        ).cpu()
    return tokens.tolist()


def _sample_rows(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None], vocab: int
) -> torch.Tensor:
    dev = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=dev)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=dev).clamp(max=vocab)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    ordered, order = torch.sort(logits / temperature[:, None], dim=-1, descending=True)
    kth = ordered.gather(1, (top_k - 1)[:, None])
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))  # ties with the k-th token stay
    probs = torch.softmax(ordered, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the most likely token always stays).
    probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p[:, None], 0.0)
    cdf = probs.cumsum(-1)
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(dev) * cdf[:, -1]
    picked = torch.searchsorted(cdf, u[:, None], right=True).clamp(max=vocab - 1)
    return order.gather(1, picked)[:, 0]


def drawn_logprobs(
    logits: torch.Tensor, tokens: list[int], draws: list[tuple[int, int, SamplingParams, torch.Generator | None]]
) -> dict[int, TokenLogprobs]:
    """logits: [num_draws, vocab], the rows ``tokens`` were drawn from -> sample index -> the entry
    of its drawn token, for the draws whose request asked for ``logprobs``."""
    asked = [(j, i, p.logprobs) for j, (i, _, p, _) in enumerate(draws) if p.logprobs is not None]
    if not asked:
        return {}
    entries = score(logits[[j for j, _, _ in asked]], [tokens[j] for j, _, _ in asked], [k for _, _, k in asked])
    return {i: entry for (_, i, _), entry in zip(asked, entries)}


def top_logprobs(logits: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """logits: [num_rows, vocab] -> per row the ``k`` most likely ``(token, logprob)``, most likely first."""
    values, tokens = torch.log_softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
    return [list(zip(t, v)) for t, v in zip(tokens.tolist(), values.tolist())]
