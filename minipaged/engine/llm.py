"""``LLM``: the engine's public face, shaped like vLLM's so what is learnt here carries over.

    llm = LLM()                                   # the embedded tiny model, paged KV cache
    out = llm.generate(["abc<copy>hello<end>"], SamplingParams(temperature=0))
    out[0].outputs[0].text                        # 'hello'

For notebooks there is a step-level API: :meth:`LLM.add_request`, :meth:`LLM.step` (returns a
:class:`StepSnapshot` of what ran and of the pool) and :meth:`LLM.kv_stats`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minipaged.engine.block_manager import ContiguousKVManager, PagedKVManager
from minipaged.engine.model_runner import ModelRunner
from minipaged.engine.sampler import sample
from minipaged.engine.sampling_params import SamplingParams
from minipaged.engine.scheduler import Scheduler
from minipaged.engine.sequence import Sequence, Status
from minipaged.kv.contiguous import ContiguousKVCache
from minipaged.kv.slot_mapping import PagedKVCache
from minipaged.model.loader import load_model

Prompt = str | list[int]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


@dataclass
class StepSnapshot:
    """What one :meth:`LLM.step` did, and the state it left (for drawing).

    ``scheduled``: one dict per sequence run (``seq_id``, ``request_id``, ``kind`` = "prefill" or
    "decode", ``num_tokens``, ``num_cached_tokens``); ``block_tables``: seq_id -> physical block
    ids of every live sequence; ``ref_cnt`` / ``cached``: per physical block (paged cache only).
    """

    step: int
    scheduled: list[dict]
    preempted: list[int]
    finished: list[RequestOutput]
    waiting: list[int]
    running: list[int]
    block_tables: dict[int, list[int]]
    num_tokens: dict[int, int]
    ref_cnt: list[int] = field(default_factory=list)
    cached: list[bool] = field(default_factory=list)
    num_free_blocks: int = 0


class LLM:
    """A small continuous-batching engine over a paged (or, for comparison, contiguous) KV cache.

    ``num_kvcache_blocks`` sizes the pool (default: enough for ``max_num_seqs`` sequences of
    ``max_model_len`` tokens). ``kv_cache="contiguous"`` gives each sequence a ``max_model_len``
    reservation in the same number of slots instead.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        block_size: int = 16,
        num_kvcache_blocks: int | None = None,
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = 2048,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = False,
        attention_backend: str = "auto",
        kv_cache: str = "paged",
        dtype: torch.dtype | str = torch.float32,
        device: str | torch.device | None = None,
    ) -> None:
        if kv_cache not in ("paged", "contiguous"):
            raise ValueError(f"kv_cache must be 'paged' or 'contiguous', got {kv_cache!r}")
        if block_size < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")
        if kv_cache == "contiguous" and enable_prefix_caching:
            raise ValueError("prefix caching needs kv_cache='paged' (a contiguous cache cannot share blocks)")
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.model, self.tokenizer = load_model(model, dtype=dtype, device=device)
        cfg = self.model.config
        self.max_model_len = max_model_len or cfg.max_position_embeddings
        self.block_size = block_size
        num_blocks = num_kvcache_blocks or max_num_seqs * -(-self.max_model_len // block_size)
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
        if kv_cache == "paged":
            kv = PagedKVCache(cfg.num_hidden_layers, num_blocks, block_size, *shape[1:], dtype=dtype, device=device)
            self.kv = PagedKVManager(kv, enable_prefix_caching, attention_backend)
        else:
            if num_blocks * block_size < self.max_model_len:
                raise ValueError(
                    f"a contiguous cache of {num_blocks * block_size} slots cannot hold one "
                    f"sequence of max_model_len={self.max_model_len}"
                )
            cache = ContiguousKVCache(
                *shape, max_seq_len=self.max_model_len, num_slots=num_blocks * block_size, dtype=dtype, device=device
            )
            self.kv = ContiguousKVManager(cache)
        self.kv_cache = kv_cache
        self.num_blocks = num_blocks
        self.scheduler = Scheduler(self.kv, max_num_seqs, max_num_batched_tokens)
        self.runner = ModelRunner(self.model, self.kv)
        self._request_ids = itertools.count()
        self._requests: dict[int, tuple[str | None, list[int], list[Sequence]]] = {}
        self._step = 0
        self.prefill_tokens_computed = 0
        self.peak_slots_allocated = 0  # the most KV slots in use after any step

    # -- requests --------------------------------------------------------------------------
    def _encode(self, prompt: Prompt, index: int) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompt {index} is text but this model folder has no tokenizer: pass token ids")
            return prompt, self.tokenizer.encode(prompt)
        ids = [int(t) for t in prompt]
        return None, ids

    def _validate(self, ids: list[int], params: SamplingParams, index: int) -> None:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params of prompt {index} must be a SamplingParams, got {type(params).__name__}")
        if not ids:
            raise ValueError(f"prompt {index} is empty")
        vocab = self.model.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt {index} has token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt {index}: {len(ids)} prompt tokens + max_tokens {params.max_tokens} = {total} "
                f"exceeds max_model_len {self.max_model_len}"
            )
        need = -(-total // self.block_size)
        if self.kv_cache == "paged" and need > self.num_blocks:
            raise ValueError(
                f"prompt {index} needs {need} blocks of {self.block_size} tokens but the whole pool "
                f"has {self.num_blocks}: it could never run"
            )

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None) -> int:
        """Queue one request; returns its id. Raises ValueError (and queues nothing) on bad input."""
        return self._add_many([prompt], [params or SamplingParams()])[0]

    def _add_many(self, prompts: Seq[Prompt], params: Seq[SamplingParams]) -> list[int]:
        encoded = [self._encode(p, i) for i, p in enumerate(prompts)]
        for i, ((_, ids), sp) in enumerate(zip(encoded, params)):
            self._validate(ids, sp, i)
        request_ids = []
        for (text, ids), sp in zip(encoded, params):
            rid = next(self._request_ids)
            if self.kv_cache == "paged":  # n samples fork after the prompt, sharing its blocks
                seqs = [Sequence(rid, ids, sp, self.block_size)]
            else:  # no sharing: each sample is a sequence of its own from the start
                seqs = [Sequence(rid, ids, sp, self.block_size, sample_index=i) for i in range(sp.n)]
                for s in seqs:
                    s.fork_pending = False
            for s in seqs:
                self.scheduler.add(s)
            self._requests[rid] = (text, ids, seqs)
            request_ids.append(rid)
        return request_ids

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one step --------------------------------------------------------------------------
    def step(self) -> StepSnapshot:
        """Schedule, run the model once, sample, and finish what is done."""
        batch = self.scheduler.schedule()
        scheduled = [
            dict(
                seq_id=s.seq_id,
                request_id=s.request_id,
                kind="decode" if s.is_decode(n) else "prefill",
                num_tokens=n,
                num_cached_tokens=s.num_computed_tokens,
            )
            for s, n in zip(batch.seqs, batch.q_lens)
        ]
        finished_requests: set[int] = set()
        if batch.seqs:
            logits = self.runner.run(batch)
            self.prefill_tokens_computed += sum(n for s, n in zip(batch.seqs, batch.q_lens) if not s.is_decode(n))
            for row, (seq, n) in enumerate(zip(batch.seqs, batch.q_lens)):
                seq.num_computed_tokens += n
                if seq.num_computed_tokens < len(seq):
                    continue  # a prefill chunk that did not reach the end: nothing to sample yet
                family = [seq]
                if seq.fork_pending:
                    seq.fork_pending = False
                    family += self._fork(seq)
                for s in family:
                    if self._append_token(s, sample(logits[row], s.params, s.generator)):
                        finished_requests.add(s.request_id)
        self._step += 1
        self.peak_slots_allocated = max(self.peak_slots_allocated, self.kv.slots_allocated())
        outputs = [self._output(r) for r in sorted(finished_requests)]
        finished = [o for o in outputs if o.finished]  # all n samples of the request are done
        return self._snapshot(scheduled, [s.seq_id for s in batch.preempted], finished)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        children = []
        for i in range(1, parent.params.n):
            child = parent.fork(i)
            self.kv.fork(parent, child)
            self.scheduler.add_running(child)
            self._requests[parent.request_id][2].append(child)
            children.append(child)
        return children

    def _append_token(self, seq: Sequence, token: int) -> bool:
        """Append a sampled token; finish the sequence if it is done. Returns True if it finished."""
        seq.token_ids.append(token)
        p = seq.params
        if not p.ignore_eos and token == self.model.config.eos_token_id:
            self.scheduler.finish(seq, "stop")
        elif seq.num_output_tokens >= p.max_tokens or len(seq) >= self.max_model_len:
            self.scheduler.finish(seq, "length")
        return seq.status is Status.FINISHED

    # -- outputs and figures ---------------------------------------------------------------
    def _output(self, request_id: int) -> RequestOutput:
        text, ids, seqs = self._requests[request_id]
        eos = self.model.config.eos_token_id
        outs = []
        for s in sorted(seqs, key=lambda s: s.sample_index):
            shown = [t for t in s.output_token_ids if t != eos or s.params.ignore_eos]
            decoded = self.tokenizer.decode(shown) if self.tokenizer is not None else ""
            outs.append(CompletionOutput(s.sample_index, decoded, s.output_token_ids, s.finish_reason))
        return RequestOutput(request_id, text, ids, outs, seqs[0].num_cached_tokens)

    def _live(self) -> list[Sequence]:
        return list(self.scheduler.running)

    def _snapshot(self, scheduled: list[dict], preempted: list[int], finished: list[RequestOutput]) -> StepSnapshot:
        live = self._live()
        snap = StepSnapshot(
            step=self._step,
            scheduled=scheduled,
            preempted=preempted,
            finished=finished,
            waiting=[s.seq_id for s in self.scheduler.waiting],
            running=[s.seq_id for s in live],
            block_tables={s.seq_id: list(s.block_table.block_ids) for s in live},
            num_tokens={s.seq_id: s.num_computed_tokens for s in live},
        )
        if isinstance(self.kv, PagedKVManager):
            snap.ref_cnt = [b.ref_cnt for b in self.kv.pool.blocks]
            snap.cached = [b.block_hash is not None for b in self.kv.pool.blocks]
            snap.num_free_blocks = self.kv.pool.num_free_blocks
        return snap

    def kv_stats(self) -> dict:
        """Pool figures: blocks, free blocks, preemptions, live tokens vs allocated slots, prefix hits."""
        stats = dict(
            kv_cache=self.kv_cache,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            num_preemptions=self.scheduler.num_preemptions,
            tokens_held=self.kv.tokens_held(self._live()),
            slots_allocated=self.kv.slots_allocated(),
            peak_slots_allocated=self.peak_slots_allocated,
            prefill_tokens_computed=self.prefill_tokens_computed,
        )
        if isinstance(self.kv, PagedKVManager):
            pool = self.kv.pool
            stats.update(
                num_free_blocks=pool.num_free_blocks,
                prefix_hit_tokens=self.kv.hit_tokens,
                blocks_saved=sum(b.ref_cnt - 1 for b in pool.blocks if b.ref_cnt > 1),
                cached_blocks=len(self.kv.prefix_cache) if self.kv.prefix_cache is not None else 0,
                cow_copies=self.kv.num_cow_copies,
            )
        else:
            stats.update(num_free_blocks=self.kv.cache.arena.free_slots // self.block_size)
        return stats

    # -- the batch API ---------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (a string, a list of strings, token ids, or a list of them).

        Returns one :class:`RequestOutput` per prompt, in order. Invalid input raises ValueError
        before anything is queued.
        """
        if isinstance(prompts, str) or (isinstance(prompts, Seq) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            return []
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        if self.has_unfinished_requests():
            raise RuntimeError("generate() needs an idle engine; finish the requests added with add_request first")
        ids = self._add_many(prompts, params)
        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm) as bar:
            while self.has_unfinished_requests():
                bar.update(len(self.step().finished))
        return [self._output(r) for r in ids]
