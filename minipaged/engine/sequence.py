"""One sequence being generated: its tokens, how many have K/V in the cache, its blocks."""

from __future__ import annotations

import enum
import itertools

import torch

from minipaged.engine.sampling_params import SamplingParams
from minipaged.kv.block_table import BlockTable


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


class Sequence:
    """A request's prompt plus the tokens sampled so far.

    ``num_computed_tokens`` counts the tokens whose K/V are in the cache (prefix-cache hits
    included). A step computes ``token_ids[num_computed_tokens : num_computed_tokens + n]``; when
    that reaches the last token, the step's logits give the next token. Preemption resets it to
    0 and the whole sequence is recomputed on resumption (the sampled tokens are kept).
    """

    def __init__(
        self,
        request_id: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        block_size: int,
        sample_index: int = 0,
    ) -> None:
        self.seq_id = next(_ids)
        self.request_id = request_id
        self.sample_index = sample_index
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hits at the last admission (not all computed tokens)
        self.block_table = BlockTable(block_size)
        self.block_hashes: list[int] = []  # hashes of this sequence's full blocks, in order
        self.finish_reason: str | None = None
        self.fork_pending = params.n > 1 and sample_index == 0  # parent of n samples, not yet forked
        self.family: list[Sequence] = [self]  # the request's samples, shared by all of them (see fork)
        self.generator = None
        if params.seed is not None:
            # One stream per (request seed, sample): independent of batching and preemption.
            self.generator = torch.Generator().manual_seed((params.seed * 1_000_003 + sample_index) % 2**64)

    @classmethod
    def for_request(
        cls, request_id: int, prompt_token_ids: list[int], params: SamplingParams, block_size: int, fork_later: bool
    ) -> list[Sequence]:
        """The sequences of one request. With ``fork_later`` (a paged cache) the ``n`` samples start
        as one sequence that forks once the prompt is computed, sharing its blocks; otherwise
        (nothing can be shared) each sample is a sequence of its own from the start."""
        if fork_later:
            return [cls(request_id, prompt_token_ids, params, block_size)]
        seqs = [cls(request_id, prompt_token_ids, params, block_size, sample_index=i) for i in range(params.n)]
        for s in seqs:
            s.fork_pending = False
            s.family = seqs
        return seqs

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

    def fork(self, sample_index: int) -> Sequence:
        """A sibling sample with the same tokens so far, joining the family; blocks are shared by
        the block manager."""
        child = Sequence(
            self.request_id,
            self.token_ids[: self.num_prompt_tokens],
            self.params,
            self.block_table.block_size,
            sample_index,
        )
        child.token_ids = list(self.token_ids)
        child.num_computed_tokens = self.num_computed_tokens
        child.num_cached_tokens = self.num_cached_tokens
        child.block_hashes = list(self.block_hashes)
        child.status = self.status
        child.family = self.family
        self.family.append(child)
        return child
