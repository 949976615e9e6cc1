"""Turn a batch of next-token logits into tokens: one call for the whole batch.

Greedy rows take one ``argmax``. The other rows are filtered together: divide by each row's
temperature, sort once, keep each row's ``top_k`` best and the smallest head of the sorted
distribution whose mass reaches its ``top_p``, then draw by inverse CDF: a uniform number
``u`` per row picks the first token whose cumulative probability exceeds ``u``.

Each seeded sequence draws its ``u`` from its own ``torch.Generator``, exactly one number per
sampled token, so its tokens are the same whether it runs alone or batched, and after a
preemption (tokens already drawn are kept, not redrawn).

A beam does not draw: :func:`top_logprobs` gives its ``k`` most likely next tokens with their
log-probabilities (log-softmax of the raw logits, in fp32), and the beam search chooses.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minipaged.engine.sampling_params import SamplingParams


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


def top_logprobs(logits: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """logits: [num_rows, vocab] -> per row the ``k`` most likely ``(token, logprob)``, most likely first."""
    values, tokens = torch.log_softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
    return [list(zip(t, v)) for t, v in zip(tokens.tolist(), values.tolist())]
