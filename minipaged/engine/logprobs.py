"""Log-probabilities, as vLLM returns them (``SamplingParams(logprobs=k, prompt_logprobs=k)``).

**Which distribution.** The model's raw one: ``log_softmax`` of the fp32 logits, before
temperature, top-k or top-p touch them. That is vLLM V1's default (``logprobs_mode=
"raw_logprobs"``), so a token's logprob does not change with the sampling settings, and a greedy
token's is the same as a sampled one's.

**One entry per scored token** (:data:`TokenLogprobs`): ``{token_id: Logprob}`` holding the
scored token first (the sampled token, or the prompt's own), then the ``k`` most likely tokens,
most likely first. If the scored token is among them it appears once, so an entry holds ``k`` or
``k + 1`` tokens. ``Logprob.rank`` is 1 + the number of tokens with a strictly greater logprob
(a greedy token has rank 1; tied tokens share a rank).

**Which rows are scored.** A sampled token is scored from its sampling row: the logits at the
last token its sequence computed. A prompt token ``j`` (``j >= 1``) is scored from the logits at
position ``j - 1``, so a request that asks for prompt logprobs needs the logits of every prompt
row, not only the last: :func:`prompt_rows` lists them for the forward (``logits_indices``:
the sampling rows first, then each prompt row a step scores). Its prompt may be computed over
several steps (chunked prefill): each step scores the prompt tokens its chunk reaches and that
are not scored yet (:func:`prompt_positions`), so a prompt recomputed after preemption is not
scored twice. Token 0 has nothing before it: its entry is ``None``, as in vLLM.

**Token text.** ``Logprob.decoded_token`` is each token decoded on its own (special tokens by
name), filled in once, when an output is built (:meth:`LogprobsRecord.decoded`): the engine's
steps never touch the tokenizer. A model without a tokenizer leaves it ``None``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch


@dataclass
class Logprob:
    """One token's log-probability, its rank in the distribution (1: the most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


TokenLogprobs = dict[int, Logprob]  # token id -> its Logprob: the scored token first, then the top k
Entry = TypeVar("Entry", bound="TokenLogprobs | None")  # a prompt's first entry is None


def score(logits: torch.Tensor, tokens: Seq[int], ks: Seq[int]) -> list[TokenLogprobs]:
    """logits: [num_rows, vocab]; tokens, ks: one per row -> row ``i``'s entry for ``tokens[i]``
    with its ``ks[i]`` most likely tokens.

    Ranks without sorting the vocabulary: the scored token's rank counts the logprobs above it
    (one comparison a row, [num_rows, vocab]); a top-k token's counts those above it among the
    top k alone ([num_rows, k, k]), since any token above it is itself one of the better ones.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [num_rows, vocab]
    target = torch.tensor(list(tokens), device=logits.device)[:, None]  # [num_rows, 1]
    chosen = logprobs.gather(1, target)  # [num_rows, 1]
    ranks = (logprobs > chosen).sum(-1) + 1  # [num_rows]
    top_values, top_ids = logprobs.topk(min(max(ks), logprobs.shape[-1]), dim=-1)  # [num_rows, k], best first
    top_ranks = (top_values[:, None, :] > top_values[:, :, None]).sum(-1) + 1  # [num_rows, k]
    entries = []
    rows = zip(tokens, ks, chosen[:, 0].tolist(), ranks.tolist(), top_ids.tolist(), top_values.tolist())
    for (token, k, value, rank, ids, values), top_rank in zip(rows, top_ranks.tolist()):
        entry = {token: Logprob(value, rank)}
        for t, v, r in zip(ids[:k], values[:k], top_rank[:k]):
            entry.setdefault(t, Logprob(v, r))
        entries.append(entry)
    return entries


def prompt_positions(num_scored: int, start: int, num_tokens: int, num_prompt_tokens: int) -> range:
    """The prompt tokens a row computing positions ``start .. start + num_tokens - 1`` scores,
    when the first ``num_scored`` prompt tokens are scored already (token 0 counts as scored):
    token ``j`` needs the logits at ``j - 1``, inside the row."""
    return range(max(start + 1, num_scored), min(start + num_tokens + 1, num_prompt_tokens))


def prompt_rows(q_lens: Seq[int], starts: Seq[int], scored: Seq[tuple[int, range, int]]) -> list[int]:
    """Indices into the step's packed tokens (rows of ``q_lens`` new tokens from ``starts``) of the
    prompt rows that ``scored`` (a ``SchedulerOutput.prompt_logprobs``) scores: for each prompt
    token ``j`` of a row, the token at ``j - 1``, in order."""
    first = [0, *itertools.accumulate(q_lens)]  # each row's first packed token
    return [first[row] + j - 1 - starts[row] for row, positions, _ in scored for j in positions]


def prompt_logprobs(
    logits: torch.Tensor, scored: Seq[tuple[int, range, int]], row_tokens: Seq[Seq[int]]
) -> dict[int, list[TokenLogprobs]]:
    """logits: [num_prompt_rows, vocab], the rows after the sampling rows, in the order of
    :func:`prompt_rows`; ``row_tokens[row]``: the tokens of that row's sequence -> row of the
    batch -> its scored prompt tokens' entries, in order."""
    tokens: list[int] = []
    ks: list[int] = []
    for row, positions, k in scored:
        tokens += [row_tokens[row][j] for j in positions]
        ks += [k] * len(positions)
    entries = iter(score(logits, tokens, ks))
    return {row: [next(entries) for _ in positions] for row, positions, _ in scored}


class LogprobsRecord(Generic[Entry]):
    """The entries of one sequence's generated tokens, or one request's prompt, as they are scored.

    ``entries`` grows one step at a time; :meth:`decoded` hands back a copy with every entry's
    token text filled in (each entry decoded once, however often an output is built).
    """

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self.entries: list[Entry] = list(entries)
        self.num_decoded = 0

    def __len__(self) -> int:
        return len(self.entries)

    def extend(self, entries: Iterable[Entry]) -> None:
        self.entries.extend(entries)

    def decoded(self, tokenizer: Any) -> list[Entry]:
        """The entries so far (``tokenizer`` None: without text)."""
        if tokenizer is not None:
            for entry in self.entries[self.num_decoded :]:
                for token, lp in entry.items() if isinstance(entry, dict) else ():
                    lp.decoded_token = tokenizer.decode([token], skip_special_tokens=False)
            self.num_decoded = len(self.entries)
        return list(self.entries)
