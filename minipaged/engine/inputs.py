"""Prompts in, checked: every problem is found before anything is queued; and the request
group (:func:`group_class`) each request's params make.

A prompt is a string (needs a tokenizer) or token ids: a list or tuple of ints, or a 1-D
integer numpy array or torch tensor. ``generate`` takes one prompt or a list of them.
Float ids (``256.7``) and bools are refused, not truncated.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence as Seq
from typing import Any, cast

import numpy as np
import torch

from minipaged.engine.beam_search import BeamGroup
from minipaged.engine.limits import Limits
from minipaged.engine.request_group import SampleGroup
from minipaged.engine.sampling_params import BeamSearchParams, SamplingParams

Prompt = str | Seq[int] | np.ndarray | torch.Tensor


def _is_token_ids(p: object) -> bool:
    if isinstance(p, (np.ndarray, torch.Tensor)):
        return p.ndim == 1
    return isinstance(p, (list, tuple)) and len(p) > 0 and isinstance(p[0], numbers.Number)


def as_prompt_list(prompts: Prompt | Seq[Prompt]) -> list[Prompt]:
    """One prompt or a list of them -> a list of prompts."""
    if isinstance(prompts, str) or _is_token_ids(prompts):
        return [cast(Prompt, prompts)]
    if isinstance(prompts, (np.ndarray, torch.Tensor)):
        raise ValueError(f"a prompt array must be 1-D token ids, got shape {tuple(prompts.shape)}")
    return list(cast(Seq[Prompt], prompts))


def as_params_list(params: SamplingParams | Seq[SamplingParams] | None, num_prompts: int) -> list[SamplingParams]:
    """One SamplingParams for all prompts (None: the defaults), or one per prompt."""
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * num_prompts
    params = list(params)
    if len(params) != num_prompts:
        raise ValueError(f"{len(params)} sampling params for {num_prompts} prompts")
    return params


def encode(prompt: Prompt, index: int, tokenizer: Any) -> tuple[str | None, list[int]]:
    """-> (the text, or None for token ids; the ids). A text prompt needs a tokenizer."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"prompt {index} is text but this model folder has no tokenizer: pass token ids")
        return prompt, tokenizer.encode(prompt)
    return None, token_ids_of(prompt, index)


def token_ids_of(prompt: object, index: int) -> list[int]:
    """The ids of a token-id prompt, as Python ints; TypeError for anything that is not integer ids."""
    if isinstance(prompt, (np.ndarray, torch.Tensor)):
        is_int = (
            prompt.dtype.kind in "iu"
            if isinstance(prompt, np.ndarray)
            else not (prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool)
        )
        if prompt.ndim != 1:
            raise ValueError(f"prompt {index}: an array prompt must be 1-D token ids, got shape {tuple(prompt.shape)}")
        if not is_int:
            raise TypeError(f"prompt {index}: an array prompt must hold integer token ids, got {prompt.dtype}")
        return [int(t) for t in prompt.tolist()]
    if not isinstance(prompt, (list, tuple)):
        raise TypeError(f"prompt {index} must be a string or a list of token ids, got {type(prompt).__name__}")
    for pos, t in enumerate(prompt):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral):
            raise TypeError(f"prompt {index}: token ids must be ints, got {t!r} at position {pos}")
    return [int(t) for t in prompt]


def group_class(params: object) -> type[SampleGroup] | type[BeamGroup] | None:
    """The one place that tells a beam search from sampling: the request group ``params`` make
    (None: they are neither kind of params)."""
    if isinstance(params, BeamSearchParams):
        return BeamGroup
    return SampleGroup if isinstance(params, SamplingParams) else None


def check_request(ids: list[int], params: SamplingParams | BeamSearchParams, index: int, limits: Limits) -> None:
    """Refuse a request that could never run, saying why and what to change."""
    kind = group_class(params)
    if kind is None:
        raise TypeError(f"sampling params of prompt {index} must be a SamplingParams, got {type(params).__name__}")
    if not ids:
        raise ValueError(f"prompt {index} is empty")
    bad = [t for t in ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise ValueError(f"prompt {index} has token ids outside the vocabulary [0, {limits.vocab_size}): {bad[:5]}")
    if params.n > limits.max_num_seqs:
        raise ValueError(
            f"prompt {index} asks for {kind.asks_for(params)} but max_num_seqs={limits.max_num_seqs}: they could "
            f"never run together; raise max_num_seqs or ask for fewer"
        )
    total = len(ids) + params.max_tokens
    if total > limits.max_model_len:
        raise ValueError(
            f"prompt {index}: {len(ids)} prompt tokens + max_tokens {params.max_tokens} = {total} "
            f"exceeds max_model_len {limits.max_model_len}"
        )
    num_seqs = kind.check(params, index, limits)  # kind-specific checks; the sequences held at once
    # The last sampled token is never stored: a sequence holds at most total - 1 tokens of K/V.
    why = limits.kv_room(total, num_seqs)
    if why is not None:
        raise ValueError(f"prompt {index} {why}: it could never run")
