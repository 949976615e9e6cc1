"""``LLM``: the engine's public face, shaped like vLLM's so what is learnt here carries over.

    llm = LLM()                                   # the embedded tiny model, paged KV cache
    out = llm.generate(["abc<copy>hello<end>"], SamplingParams(temperature=0))
    out[0].outputs[0].text                        # 'hello'

One step hands three plain records one way (:meth:`LLM.engine_step`, vLLM V1's
``EngineCore.step``): the :class:`Scheduler` decides (``schedule`` -> a
:class:`~minipaged.engine.scheduler_output.SchedulerOutput`), the :class:`ModelRunner` executes
(``execute_model`` -> a :class:`~minipaged.engine.runner_output.ModelRunnerOutput`), and the
scheduler applies it (``commit``, then ``update_from_output``: the request groups' decisions);
the step's :class:`~minipaged.engine.step_output.StepOutput` comes back. For notebooks and
servers there is a step-level API, as in vLLM's ``LLMEngine``: :meth:`LLM.add_request`,
:meth:`LLM.step` (the :class:`RequestOutput` of every request that got a token),
:meth:`LLM.abort_request`, :meth:`LLM.kv_stats`, :meth:`LLM.pool_summary` and ``LLM.num_steps``.
Whoever watches the engine (drawings, the server, the timers, the paper) reads the step's
output or subscribes to it (:meth:`LLM.subscribe`); the engine builds no picture.
:meth:`LLM.beam_search` runs beam search; :meth:`LLM.chat` renders conversations with the
model's chat template and generates.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from minipaged.engine import inputs
from minipaged.engine.beam_search import BeamGroup, BeamSearchOutput
from minipaged.engine.config import EngineConfig
from minipaged.engine.kv_layout import build_kv_layout
from minipaged.engine.messages import Conversation, as_conversations, render, template_of
from minipaged.engine.model_runner import ModelRunner
from minipaged.engine.outputs import RequestOutput
from minipaged.engine.plugins import EnginePlugins
from minipaged.engine.pool_summary import PoolSummary, SequenceState
from minipaged.engine.request_group import RequestGroup
from minipaged.engine.sampling_params import BeamSearchParams, SamplingParams
from minipaged.engine.scheduler import Scheduler
from minipaged.engine.scheduler_output import SchedulerOutput
from minipaged.engine.sequence import Sequence
from minipaged.engine.step_output import StepOutput
from minipaged.engine.stop_checker import StopChecker
from minipaged.model.loader import load_model
from minipaged.model.precision import load_dtype, resolve_precision

log = logging.getLogger("minipaged")


class LLM:
    """A small continuous-batching engine over a paged (or, for comparison, contiguous) KV cache.

    ``num_kvcache_blocks`` sizes the pool; without it, ``kv_cache_memory`` bytes do (see
    :mod:`minipaged.engine.config`). ``kv_layout="contiguous"`` gives each sequence one
    reservation in the same number of slots instead (``contiguous_reserve``: Orca's ``"max"``,
    ``"pow2"`` or ``"oracle"``). ``preemption_mode="swap"`` moves a preempted sequence's blocks
    to ``swap_space`` bytes of host memory instead of recomputing them. ``attention_backend``:
    ``"reference"`` (the per-sequence oracle), ``"torch"`` (batched), ``"triton"`` or ``"auto"``.
    ``plugins`` (:class:`~minipaged.engine.plugins.EnginePlugins`) swaps in your own block pool,
    slot mapping, block hashing, prefix lookup, copy-on-write, fork or scheduling policy.
    ``dtype`` (:mod:`minipaged.model.precision`): ``"auto"`` (the default) multiplies a large
    model's weights in bf16 where the CPU does so in hardware, with a bf16 KV cache and fp32
    elsewhere; ``"float32"`` is exact to transformers' fp32 forward; ``"bfloat16"`` is bf16 throughout.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        dtype: torch.dtype | str = "auto",
        device: str | torch.device | None = None,
        plugins: EnginePlugins | None = None,
        **engine_args: Any,
    ) -> None:
        cfg = EngineConfig(**engine_args)  # every argument checked before the model is loaded
        plugins = plugins or EnginePlugins()
        if not isinstance(plugins, EnginePlugins):
            raise TypeError(f"plugins must be an EnginePlugins, got {type(plugins).__name__}")
        self.plugins = plugins
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        weights_dtype = load_dtype(dtype)  # a bad dtype is refused before the model is loaded
        self.model, self.tokenizer = load_model(model, dtype=weights_dtype, device=device)
        self.model.fuse()  # Q/K/V and gate/up as one matrix each: fewer, wider products a step
        weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.precision = resolve_precision(dtype, device, weight_bytes)
        if self.precision.bf16_products:
            self.model = self.model.pack_bf16()
        # Said at load when the choice changes the numbers (a real model on a bf16 CPU): why bf16.
        log.log(logging.INFO if self.precision.bf16_products else logging.DEBUG, "numbers: %s", self.precision.reason)
        dtype = self.precision.kv_cache
        mc = self.model.config
        self.config, self.block_size, self.max_model_len = cfg, cfg.block_size, cfg.model_len(mc)
        self.num_blocks, why = cfg.num_blocks(mc, dtype, device)
        if cfg.num_kvcache_blocks is None:
            log.info("KV cache: %s", why)
        layout = build_kv_layout(cfg, mc, self.num_blocks, self.max_model_len, dtype, device, plugins)
        self.kv_manager = layout.manager
        self.runner = ModelRunner(self.model, layout.cache, layout.attention, layout.host_cache, plugins.slot_mapping)
        self.kv_cache = layout.cache
        stop = StopChecker(mc.eos_token_ids, self.max_model_len, self.tokenizer)
        self.scheduler = Scheduler(
            self.kv_manager, cfg.max_num_seqs, cfg.max_num_batched_tokens, stop, cfg.preemption_mode,
            plugins.scheduler_policy,
        )  # fmt: skip
        self.limits = inputs.Limits(
            mc.vocab_size, self.max_model_len, cfg.max_num_seqs, cfg.max_num_batched_tokens,
            self.tokenizer is not None, self.kv_manager.can_fork, self.kv_manager.refuse,
        )  # fmt: skip
        self._request_ids = itertools.count()
        self._requests: dict[int, RequestGroup] = {}
        self._step = 0
        self.failed_request_ids: list[int] = []  # the requests of the last step that raised
        self.observers: list[Callable[[StepOutput], None]] = []  # called with every step's output
        self._pool_observers: list[Callable[[StepOutput], None]] = []  # those that want the pool in it

    # -- requests --------------------------------------------------------------------------
    def add_request(self, prompt: inputs.Prompt, params: SamplingParams | None = None) -> int:
        """Queue one request; returns its id. Raises (and queues nothing) on bad input."""
        return self._add_many([prompt], [params or SamplingParams()])[0]

    def _add_many(self, prompts: list[inputs.Prompt], params: Seq[SamplingParams | BeamSearchParams]) -> list[int]:
        encoded = [inputs.encode(p, i, self.tokenizer) for i, p in enumerate(prompts)]
        for i, ((_, ids), sp) in enumerate(zip(encoded, params)):
            inputs.check_request(ids, sp, i, self.limits)
        request_ids = []
        for (text, ids), sp in zip(encoded, params):
            rid = next(self._request_ids)
            kind = inputs.group_class(sp)
            assert kind is not None  # checked above
            group = kind.create(
                rid, text, ids, sp, self.block_size, self.kv_manager.can_fork, self.model.config.eos_token_ids
            )
            self._requests[rid] = group
            self.scheduler.add(group)
            request_ids.append(rid)
        return request_ids

    def abort_request(self, request_id: int | Seq[int]) -> None:
        """Stop one request (or several) wherever it is and free its blocks; finished ones are left alone."""
        ids = [request_id] if isinstance(request_id, int) else list(request_id)
        unknown = [r for r in ids if r not in self._requests]
        if unknown:
            raise ValueError(f"no request with id {unknown[0]} was ever added")
        for rid in ids:
            self.scheduler.abort(self._requests[rid].members())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample, finish what is done; returns the output so far
        of every request that got a token this step (by request id; beam searches are left out:
        :meth:`beam_search` reports them). ``RequestOutput.finished`` marks those it completed.

        A step is all or nothing. If it raises (an error in the forward, Ctrl-C while sampling),
        every sequence it ran goes back to the waiting queue to be recomputed, nothing it filled is
        published to the prefix cache, no copy it owed is replayed, and seeded samples get
        their random draw back: a later ``step()`` gives every request the tokens it would have
        had without the failure (``abort_request`` drops a request instead).
        ``failed_request_ids`` lists the requests that the failed step ran.
        """
        return self.engine_step().outputs

    def engine_step(self, outputs: bool = True, pool: bool = False) -> StepOutput:
        """One step, its three records handed one way; returns its :class:`StepOutput` (with the
        :class:`RequestOutput` s :meth:`step` returns unless ``outputs=False``, and the pool it
        left with ``pool=True`` or for an observer that asked) and hands it to every subscribed
        observer. The rollback that makes a failed step leave no trace is here (see :meth:`step`)."""
        start = time.perf_counter()
        try:
            scheduled = self.scheduler.schedule()
            mid = time.perf_counter()
            ran = self.runner.run(scheduled)
        except BaseException:
            self.failed_request_ids = self.scheduler.rollback()
            raise
        executed = time.perf_counter()
        self.scheduler.commit(scheduled, ran)
        at_peak = self.kv_stats() if self.observers else None  # nothing freed yet: the step's fullest
        decisions = self.scheduler.update_from_output(scheduled, ran)
        self._step += 1
        end = time.perf_counter()
        ids = sorted({seq.request_id for _, seq in scheduled.samples})
        running = self.scheduler.running
        out = StepOutput(
            self._step, scheduled, ran, decisions, ids,
            [self._requests[r].output(self.tokenizer) for r in ids if self._requests[r].streams] if outputs else [],
            [r for r in ids if self._requests[r].finished],
            len(running), len(self.scheduler.waiting), sum(len(u) for u in self.scheduler.swapped),
            len({s.request_id for s in running}), at_peak,
            {"schedule": mid - start, "execute": executed - mid, **ran.seconds, "update": end - executed,
             "total": end - start},
        )  # fmt: skip
        if pool or self._pool_observers:
            out.pool = self.pool_summary()
        for observer in list(self.observers):
            observer(out)
        return out

    def run_step(self) -> tuple[SchedulerOutput, StepOutput]:
        """One step without building outputs: the :class:`SchedulerOutput` it ran, and its
        :class:`StepOutput` (the older form of :meth:`engine_step`, kept for its callers)."""
        out = self.engine_step(outputs=False)
        return out.scheduler_output, out

    def subscribe(self, observer: Callable[[StepOutput], None], pool: bool = False) -> None:
        """Call ``observer`` with every step's :class:`StepOutput` (until :meth:`unsubscribe`);
        with ``pool=True`` its ``pool`` holds the pool the step left."""
        self.observers.append(observer)
        if pool:
            self._pool_observers.append(observer)

    def unsubscribe(self, observer: Callable[[StepOutput], None]) -> None:
        self.observers.remove(observer)
        if observer in self._pool_observers:
            self._pool_observers.remove(observer)

    @property
    def num_steps(self) -> int:
        """Steps run so far (failed ones not counted)."""
        return self._step

    def get_output(self, request_id: int) -> RequestOutput:
        """What request ``request_id`` has so far (finished or not)."""
        if request_id not in self._requests:
            raise ValueError(f"no request with id {request_id} was ever added")
        return self._requests[request_id].output(self.tokenizer)

    def kv_stats(self) -> dict:
        """Pool figures: blocks, free blocks, preemptions, live tokens vs allocated slots, prefix hits, swaps."""
        kv = self.kv_manager
        return dict(
            kv_layout=self.config.kv_layout,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            tokens_held=kv.tokens_held(self.scheduler.running),
            slots_allocated=kv.slots_allocated(),
            peak_slots_allocated=kv.peak_slots_allocated,
            **self.scheduler.stats(),
            **kv.stats(),
        )

    def pool_summary(self) -> PoolSummary:
        """The pool as an observer draws it (:class:`PoolSummary`): every unfinished sequence with
        its blocks, every block's ``ref_cnt`` and cached flag (paged only), and :meth:`kv_stats`."""
        s = self.scheduler

        def states(seqs: Seq[Sequence], status: str) -> list[SequenceState]:
            return [
                SequenceState(q.seq_id, q.request_id, q.sample_index, status, q.num_computed_tokens,
                              list(q.block_table.block_ids) if status == "running" else [])
                for q in seqs
            ]  # fmt: skip

        ref_cnt, cached, num_free = self.kv_manager.block_states()
        return PoolSummary(
            self.config.kv_layout, self.num_blocks, self.block_size, num_free, ref_cnt, cached,
            states(s.running, "running"), states(list(s.waiting), "waiting"),
            states([q for unit in s.swapped for q in unit], "swapped"), self.kv_stats(),
        )  # fmt: skip

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM's ``LLM.reset_prefix_cache``: returns False and
        changes nothing while any request holds blocks (let it finish, or abort it, first);
        True once nothing is cached. The next request computes its whole prompt."""
        return self.kv_manager.reset_prefix_cache()

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
        prompt_list = inputs.as_prompt_list(prompts)
        ids = self._run_all(prompt_list, inputs.as_params_list(sampling_params, len(prompt_list)), use_tqdm)
        return [self.get_output(r) for r in ids]

    def chat(
        self,
        messages: Conversation | Seq[Conversation],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of ``{"role", "content"}`` dicts) or a list of them.

        Each is rendered with the model's chat template (or ``chat_template``, Jinja source) and
        generated like a prompt; ``RequestOutput.prompt`` is the rendered text. A model without a
        template, or a malformed conversation, raises before anything is queued.
        """
        conversations = as_conversations(messages)
        template = template_of(self.tokenizer, chat_template)
        rendered = render(conversations, template, self.tokenizer, add_generation_prompt)
        outputs = self.generate([ids for _, ids in rendered], sampling_params, use_tqdm)
        for out, (text, _) in zip(outputs, rendered):
            out.prompt = text
        return outputs

    def beam_search(
        self, prompts: inputs.Prompt | Seq[inputs.Prompt], params: BeamSearchParams, use_tqdm: bool = False
    ) -> list[BeamSearchOutput]:
        """Beam search for every prompt (see :mod:`minipaged.engine.beam_search`): one
        :class:`BeamSearchOutput` per prompt, its ``beam_width`` best sequences best first."""
        if inputs.group_class(params) is not BeamGroup:
            raise TypeError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        prompt_list = inputs.as_prompt_list(prompts)
        ids = self._run_all(prompt_list, [params] * len(prompt_list), use_tqdm)
        results = []
        for rid in ids:
            group = self._requests[rid]
            assert isinstance(group, BeamGroup) and group.final is not None
            for s in group.final:
                shown = s.token_ids[:-1] if s.finish_reason == "stop" else s.token_ids
                s.text = self.tokenizer.decode(shown) if self.tokenizer is not None else ""
            results.append(BeamSearchOutput(group.final, rid, group.prompt_token_ids))
        return results

    def _run_all(
        self, prompts: list[inputs.Prompt], params: Seq[SamplingParams | BeamSearchParams], use_tqdm: bool
    ) -> list[int]:
        """Queue the prompts and step until every one is done (on any error they are aborted)."""
        if not prompts:
            return []
        if self.has_unfinished_requests():
            raise RuntimeError("needs an idle engine; finish or abort the requests added with add_request")
        ids = self._add_many(prompts, params)
        try:
            with tqdm(total=len(ids), desc="generate", disable=not use_tqdm) as bar:
                while self.has_unfinished_requests():
                    bar.update(len(self.engine_step(outputs=False).finished))
        except BaseException:
            self.abort_request(ids)
            raise
        return ids
