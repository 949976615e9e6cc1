"""``LLM``: the engine's public face, shaped like vLLM's so what is learnt here carries over.

    llm = LLM()                                   # the embedded tiny model, paged KV cache
    out = llm.generate(["abc<copy>hello<end>"], SamplingParams(temperature=0))
    out[0].outputs[0].text                        # 'hello'

One step: the :class:`Scheduler` picks the work, the :class:`ModelRunner` packs it, runs the
model and samples every row at once, and the scheduler's ``postprocess`` appends the tokens and
finishes what is done. For notebooks there is a step-level API:
:meth:`LLM.add_request`, :meth:`LLM.step` (returns a :class:`StepSnapshot`),
:meth:`LLM.abort_request` and :meth:`LLM.kv_stats`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence as Seq
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minipaged.engine import inputs
from minipaged.engine.config import EngineConfig
from minipaged.engine.kv_manager import ContiguousKVManager, PagedKVManager
from minipaged.engine.model_runner import ModelRunner
from minipaged.engine.outputs import Request, RequestOutput, StepSnapshot, describe_batch, kv_stats, take_snapshot
from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.scheduler import Scheduler
from minipaged.engine.sequence import Sequence
from minipaged.model.loader import load_model

log = logging.getLogger("minipaged")


class LLM:
    """A small continuous-batching engine over a paged (or, for comparison, contiguous) KV cache.

    ``num_kvcache_blocks`` sizes the pool; without it, ``kv_cache_memory`` bytes do (see
    :mod:`minipaged.engine.config`). ``kv_layout="contiguous"`` gives each sequence a
    ``max_model_len`` reservation in the same number of slots instead. ``attention_backend``:
    ``"reference"`` (the per-sequence oracle), ``"torch"`` (batched), ``"triton"`` or ``"auto"``.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        dtype: torch.dtype | str = torch.float32,
        device: str | torch.device | None = None,
        **engine_args,
    ) -> None:
        cfg = EngineConfig(**engine_args)  # every argument checked before the model is loaded
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.model, self.tokenizer = load_model(model, dtype=dtype, device=device)
        mc = self.model.config
        self.config, self.block_size, self.max_model_len = cfg, cfg.block_size, cfg.model_len(mc)
        self.num_blocks, why = cfg.num_blocks(mc, dtype, device)
        if cfg.num_kvcache_blocks is None:
            log.info("KV cache: %s", why)
        self.runner = ModelRunner(self.model, cfg, self.num_blocks, self.max_model_len)
        self.kv_cache = self.runner.kv_cache  # the tensors; the manager below only hands out slots
        if cfg.kv_layout == "paged":
            self.kv_manager = PagedKVManager(self.num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        else:
            self.kv_manager = ContiguousKVManager(self.kv_cache, cfg.block_size)
        self.scheduler = Scheduler(
            self.kv_manager, cfg.max_num_seqs, cfg.max_num_batched_tokens, self.max_model_len, mc.eos_token_ids
        )
        self._request_ids = itertools.count()
        self._requests: dict[int, Request] = {}
        self._step = 0

    # -- requests --------------------------------------------------------------------------
    def add_request(self, prompt: inputs.Prompt, params: SamplingParams | None = None) -> int:
        """Queue one request; returns its id. Raises (and queues nothing) on bad input."""
        return self._add_many([prompt], [params or SamplingParams()])[0]

    def _add_many(self, prompts: list[inputs.Prompt], params: list[SamplingParams]) -> list[int]:
        encoded = [inputs.encode(p, i, self.tokenizer) for i, p in enumerate(prompts)]
        cfg, paged = self.config, self.config.kv_layout == "paged"
        for i, ((_, ids), sp) in enumerate(zip(encoded, params)):
            inputs.check_request(
                ids,
                sp,
                i,
                self.model.config.vocab_size,
                self.max_model_len,
                cfg.max_num_seqs,
                self.num_blocks if paged else None,
                self.block_size,
            )
        request_ids = []
        for (text, ids), sp in zip(encoded, params):
            rid = next(self._request_ids)
            seqs = Sequence.for_request(rid, ids, sp, self.block_size, fork_later=paged)
            for s in seqs:
                self.scheduler.add(s)
            self._requests[rid] = Request(rid, text, ids, seqs[0].family)
            request_ids.append(rid)
        return request_ids

    def abort_request(self, request_id: int | Seq[int]) -> None:
        """Stop one request (or several) wherever it is and free its blocks; finished ones are left alone."""
        ids = [request_id] if isinstance(request_id, int) else list(request_id)
        unknown = [r for r in ids if r not in self._requests]
        if unknown:
            raise ValueError(f"no request with id {unknown[0]} was ever added")
        for rid in ids:
            self.scheduler.abort(list(self._requests[rid].seqs))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one step --------------------------------------------------------------------------
    def step(self) -> StepSnapshot:
        """Schedule, run the model once, sample, finish what is done; returns what happened."""
        batch = self.scheduler.schedule()
        scheduled = describe_batch(batch)
        finished = self._run(batch)
        return take_snapshot(self._step, scheduled, batch, finished, self.scheduler)

    def _run(self, batch) -> list[RequestOutput]:
        """Run a scheduled batch; returns the requests it finished (all their samples done)."""
        done: set[int] = set()
        if batch.seqs:
            try:
                logits = self.runner.run(batch, self.kv_manager.copies)
            except BaseException:
                self.kv_manager.drop_unwritten()  # what this step published holds no K/V
                raise
            self.kv_manager.mark_written()
            rows_seqs = self.scheduler.advance(batch)  # forks n samples whose prompt is done
            if rows_seqs:
                tokens = self.runner.sample(logits, rows_seqs)
                done = {s.request_id for s in self.scheduler.postprocess([s for _, s in rows_seqs], tokens)}
        self._step += 1
        outputs = [self._output(r) for r in sorted(done)]
        return [o for o in outputs if o.finished]

    def _output(self, request_id: int) -> RequestOutput:
        return self._requests[request_id].output(self.tokenizer)

    def kv_stats(self) -> dict:
        """Pool figures: blocks, free blocks, preemptions, live tokens vs allocated slots, prefix hits."""
        return kv_stats(self.kv_manager, self.scheduler, self.num_blocks, self.block_size)

    # -- the batch API ---------------------------------------------------------------------
    def generate(
        self,
        prompts: inputs.Prompt | Seq[inputs.Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (a string, token ids, or a list of either).

        Returns one :class:`RequestOutput` per prompt, in order. Invalid input raises before
        anything is queued. If the call is interrupted (an exception, Ctrl-C), its requests are
        aborted and their blocks freed: the engine stays usable.
        """
        prompts = inputs.as_prompt_list(prompts)
        params = inputs.as_params_list(sampling_params, len(prompts))
        if not prompts:
            return []
        if self.has_unfinished_requests():
            raise RuntimeError("generate() needs an idle engine; finish or abort the requests added with add_request")
        ids = self._add_many(prompts, params)
        try:
            with tqdm(total=len(ids), desc="generate", disable=not use_tqdm) as bar:
                while self.has_unfinished_requests():
                    bar.update(len(self._run(self.scheduler.schedule())))
        except BaseException:
            self.abort_request(ids)
            raise
        return [self._output(r) for r in ids]
