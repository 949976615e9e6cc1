"""How to generate a request's tokens, named and shaped like vLLM's: :class:`SamplingParams` for
sampling (greedy, temperature, top-k/top-p, ``n`` samples, stop rules) and :class:`BeamSearchParams`
for beam search."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

# Below this temperature sampling is greedy: dividing logits by a vanishing temperature would
# overflow to inf and give NaN probabilities (vLLM draws the line at the same value).
GREEDY_BELOW = 1e-5
MAX_SEED = 2**64 - 1
# The most alternatives a logprobs entry may list (vLLM's default ``max_logprobs``, and OpenAI's cap
# on ``top_logprobs``): every scored token makes up to k + 1 Logprob objects, all sent to the
# client, so an unbounded k would let one request make the engine build and send the vocabulary.
MAX_LOGPROBS = 20


def _check_int(name: str, value: object, lowest: int, highest: int | None = None) -> int:
    # bool is an int subclass in Python, but True as a count is a bug, not a request.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if int(value) < lowest or (highest is not None and int(value) > highest):
        bounds = f">= {lowest}" if highest is None else f"in [{lowest}, {highest}]"
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return int(value)


def _check_real(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _check_logprobs(name: str, k: object) -> int | None:
    """``k`` as an int (None: not asked), within 0 .. MAX_LOGPROBS."""
    if k is None:
        return None
    count = _check_int(name, k, 0)
    if count > MAX_LOGPROBS:
        raise ValueError(f"{name} must be <= MAX_LOGPROBS = {MAX_LOGPROBS} (vLLM's max_logprobs), got {k}")
    return count


@dataclass(frozen=True)
class SamplingParams:
    """``temperature=0`` is greedy. ``top_k=0`` (or -1, vLLM's spelling) and ``top_p=1`` switch
    those filters off.

    ``seed`` (0 .. 2**64 - 1) gives the request its own random stream, so its samples do not
    depend on what else is batched with it. ``n`` samples share the prompt's KV blocks
    (copy-on-write). A sample stops at an end-of-sequence token (unless ``ignore_eos``), at any
    of ``stop_token_ids`` (even with ``ignore_eos``), when its text contains one of the ``stop``
    strings (the text is cut before it), or after ``max_tokens``. Every field is checked here,
    so a bad value fails before anything is queued.

    ``logprobs=k`` (0 .. ``MAX_LOGPROBS``) scores every generated token: its log-probability and
    rank plus the ``k`` most likely tokens at that step (``k=0``: the sampled token alone), in
    ``CompletionOutput.logprobs`` and ``cumulative_logprob``. ``prompt_logprobs=k`` scores every
    prompt token given the ones before it (``RequestOutput.prompt_logprobs``; the first token's
    entry is None). Both are the model's raw distribution, ``log_softmax`` of the fp32 logits
    before temperature, top-k and top-p (vLLM V1's default, ``logprobs_mode="raw_logprobs"``; see
    :mod:`minipaged.engine.logprobs`). A request that asks for ``prompt_logprobs`` does not read
    the prefix cache, as in vLLM: a cached block has K/V but no logits, so its whole prompt is
    computed (its blocks are still cached for other requests).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # Derived from temperature once, when the params are made (the sampler reads it every step).
    greedy: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        _check_real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, -1)
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("n", self.n, 1)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        # Kept as tuples: the params are frozen, and a caller's list must not change them later.
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        for i, text in enumerate(stop):
            if not isinstance(text, str) or not text:
                raise ValueError(f"stop[{i}] must be a non-empty string, got {text!r}")
        object.__setattr__(self, "stop", tuple(stop))
        if isinstance(self.stop_token_ids, (str, bytes)):
            raise TypeError(f"stop_token_ids must be a list of ints, got {self.stop_token_ids!r}")
        ids = list(self.stop_token_ids or ())
        for i, t in enumerate(ids):
            _check_int(f"stop_token_ids[{i}]", t, 0)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))
        for name in ("logprobs", "prompt_logprobs"):
            object.__setattr__(self, name, _check_logprobs(name, getattr(self, name)))
        object.__setattr__(self, "greedy", self.temperature < GREEDY_BELOW)


@dataclass(frozen=True)
class BeamSearchParams:
    """Beam search as vLLM's ``LLM.beam_search`` does it (see :mod:`minipaged.engine.beam_search`).

    ``beam_width`` beams live on; each proposes its ``2 x beam_width`` most likely next tokens.
    After ``max_tokens`` steps (or when every beam has ended in an end-of-sequence token, unless
    ``ignore_eos``) the best ``beam_width`` by ``cum_logprob / length ** length_penalty`` are
    returned, the length counting the prompt and not a final end-of-sequence token.
    """

    beam_width: int
    max_tokens: int = 16
    ignore_eos: bool = False
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        _check_int("beam_width", self.beam_width, 1)
        _check_int("max_tokens", self.max_tokens, 1)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        _check_real("length_penalty", self.length_penalty)

    @property
    def n(self) -> int:
        """Sequences the request may hold at once (``max_num_seqs`` counts them)."""
        return self.beam_width
