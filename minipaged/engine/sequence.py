"""One sequence being generated: its tokens, how many have K/V in the cache, its blocks.

A request becomes one or more sequences, held by its request group
(:mod:`~minipaged.engine.request_group`): ``n`` samples, or the live beams of a beam search.
Who writes what: the scheduler writes a sequence's ``status``, its token counters, and what its
group decided (:mod:`~minipaged.engine.decisions`: the tokens appended, a beam's or a scored
sample's ``cum_logprob`` and logprob entries, a finish with its ``stop_reason`` and
``text_len``); the KV manager writes its ``block_table`` and ``block_hashes``.
"""

from __future__ import annotations

import enum
import itertools
from typing import Any

import torch

from minipaged.engine.logprobs import LogprobsRecord, TokenLogprobs
from minipaged.engine.sampling_params import BeamSearchParams, SamplingParams
from minipaged.kv.block_table import BlockTable


class Status(enum.Enum):
    WAITING = "waiting"  # queued (not started, or preempted to recompute), or a sample not forked yet
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted with its K/V moved to host memory
    FINISHED = "finished"


_ids = itertools.count()


class Sequence:
    """A request's prompt plus the tokens generated so far.

    ``num_computed_tokens`` counts the tokens whose K/V are in the cache (prefix-cache hits
    included). A step computes ``token_ids[num_computed_tokens : num_computed_tokens + n]``; when
    that reaches the last token, the step's logits give the next token. Preemption by recompute
    resets it to 0 and the whole sequence is computed again on resumption (the generated tokens
    are kept); preemption by swapping keeps it, and the K/V come back from host memory.
    """

    def __init__(
        self,
        request_id: int,
        prompt_token_ids: list[int],
        params: SamplingParams | BeamSearchParams,
        block_size: int,
        sample_index: int = 0,
        generator: torch.Generator | None = None,
    ) -> None:
        self.seq_id = next(_ids)
        self.request_id = request_id
        self.sample_index = sample_index
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        # Prompt tokens the prefix cache served at the first admission (None until then), as vLLM
        # sets it once: a resume after preemption finds the sequence's own blocks, not a reuse.
        self.num_cached_tokens: int | None = None
        self.block_table = BlockTable(block_size)
        self.block_hashes: list[int] = []  # hashes of this sequence's full blocks, in order
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self.text_len: int | None = None  # the output text is cut here (before a stop string)
        self.cum_logprob = 0.0  # log-probability of the generated tokens (beams; samples asking for logprobs)
        asks = isinstance(params, SamplingParams) and params.logprobs is not None
        self.logprobs: LogprobsRecord[TokenLogprobs] | None = LogprobsRecord() if asks else None
        self.generator = generator  # a seeded sample's own random stream
        # The request group holding it, set by that group (for a reader's convenience: the engine
        # finds a sequence's group by its request id, so this module needs no group type).
        self.group: Any = None

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, req={self.request_id}.{self.sample_index}, {self.status.value}, "
            f"tokens={len(self)}, computed={self.num_computed_tokens}, blocks={self.block_table.block_ids})"
        )

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def is_decode(self, num_new_tokens: int) -> bool:
        """Whether computing ``num_new_tokens`` now is a decode step: the one token sampled last.

        Anything else is a prefill: a prompt (or a chunk of it), or a sequence recomputed after
        preemption.
        """
        return num_new_tokens == 1 and self.num_output_tokens > 0 and self.num_computed_tokens == len(self) - 1

    def branch(self) -> Sequence:
        """A new beam with this beam's tokens so far (its blocks are shared by the KV manager)."""
        child = Sequence(self.request_id, self.token_ids[: self.num_prompt_tokens], self.params, 1)
        child.block_table = BlockTable(self.block_table.block_size)
        child.token_ids = list(self.token_ids)
        child.num_computed_tokens = self.num_computed_tokens
        child.num_cached_tokens = self.num_cached_tokens
        child.status = self.status
        child.group = self.group
        child.cum_logprob = self.cum_logprob
        return child
