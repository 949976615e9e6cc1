"""The embedded tiny model and its task: copy the text after a marker, whatever precedes it.

A prompt is ``preamble + "<copy>" + text + "<end>"``; the right completion is ``text`` (then
``<eos>``). The preamble plays the part of a shared system prompt in later stages. Because the
answer needs attention over the context, a KV-cache bug shows up as wrong text.
"""

from __future__ import annotations

import random
import string
from typing import TYPE_CHECKING, Any

from minipaged.model.loader import EMBEDDED_MODEL_DIR

if TYPE_CHECKING:
    from minipaged.engine.llm import LLM

COPY, END, EOS, PAD = "<copy>", "<end>", "<eos>", "<pad>"
SPECIAL_TOKENS = [COPY, END, EOS, PAD]
TEXT_ALPHABET = string.ascii_lowercase + string.digits + " "
MAX_TEXT_CHARS = 48
MAX_PREAMBLE_CHARS = 512
MODEL_DIR = EMBEDDED_MODEL_DIR


def prompt_for(text: str, preamble: str = "") -> str:
    """The prompt that asks the embedded model to copy ``text``."""
    return f"{preamble}{COPY}{text}{END}"


def expected_completion(text: str) -> str:
    """What the model should answer for :func:`prompt_for` ``(text, ...)`` (EOS not included)."""
    return text


def random_text(
    rng: random.Random, min_chars: int = 1, max_chars: int = MAX_TEXT_CHARS, alphabet: str = TEXT_ALPHABET
) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(min_chars, max_chars)))


def random_preamble(rng: random.Random, min_chars: int = 0, max_chars: int = MAX_PREAMBLE_CHARS) -> str:
    """Filler before the marker: words or printable noise, never a special token."""
    n = rng.randint(min_chars, max_chars)
    if rng.random() < 0.5:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < n:
            words.append(random_text(rng, 1, 9, string.ascii_lowercase))
        out = " ".join(words)
    else:
        out = "".join(rng.choice(string.printable[:95]) for _ in range(n))
    return out[:n].replace("<", "(")


def held_out_cases(n: int = 200, seed: int = 1234) -> list[tuple[str, str]]:
    """``n`` seeded (text, preamble) pairs: texts of 1-48 characters, preambles of 0-512."""
    rng = random.Random(seed)
    return [(random_text(rng), random_preamble(rng)) for _ in range(n)]


def evaluate(num_cases: int = 200, seed: int = 1234, llm: LLM | None = None, **llm_kwargs: Any) -> tuple[float, int]:
    """Greedy exact-completion accuracy on :func:`held_out_cases` through ``LLM.generate``.

    ``llm_kwargs`` configure the engine (e.g. a small ``num_kvcache_blocks`` to force
    preemptions); returns (accuracy, number of cases).
    """
    from minipaged.engine.llm import LLM
    from minipaged.engine.sampling_params import SamplingParams

    llm = llm or LLM(**llm_kwargs)
    cases = held_out_cases(num_cases, seed)
    prompts = [prompt_for(text, pre) for text, pre in cases]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TEXT_CHARS + 1), use_tqdm=False)
    right = sum(o.outputs[0].text == expected_completion(text) for o, (text, _) in zip(outs, cases))
    return right / num_cases, num_cases
