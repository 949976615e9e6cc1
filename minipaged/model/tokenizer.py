"""Tokenizers: the embedded model's byte tokenizer, and Hugging Face ``tokenizer.json`` files."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Protocol

from minipaged.model.chat_template import ChatTemplate


class Tokenizer(Protocol):
    @property
    def eos_token_id(self) -> int | None: ...  # read-only here, so an implementation may say plain int

    @property
    def chat_template(self) -> ChatTemplate | None: ...  # None: the model cannot chat

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; named special tokens follow (``<copy>`` = 256, ...).

    Special tokens are written in prompt strings by name, e.g. ``"hello<copy>abc<end>"``.
    """

    def __init__(self, special_tokens: list[str], eos_token: str) -> None:
        self.special_ids = {name: 256 + i for i, name in enumerate(special_tokens)}
        self.special_names = {i: name for name, i in self.special_ids.items()}
        self.eos_token_id = self.special_ids[eos_token]
        self.vocab_size = 256 + len(special_tokens)
        self.chat_template: ChatTemplate | None = None  # a copy model, not a chat model
        self._split = re.compile("(" + "|".join(re.escape(s) for s in special_tokens) + ")")

    @classmethod
    def from_file(cls, path: str | Path) -> ByteTokenizer:
        cfg = json.loads(Path(path).read_text())
        return cls(cfg["special_tokens"], cfg["eos_token"])

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The embedded model has no BOS: ``add_special_tokens`` adds nothing (it is here for the protocol)."""
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            else:
                ids += piece.encode("utf-8")
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out, pending = [], bytearray()
        for i in ids:
            if i < 256:
                pending.append(i)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending = bytearray()
            if not skip_special_tokens:
                out.append(self.special_names.get(i, f"<{i}>"))
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer:
    """A ``tokenizer.json`` read with the ``tokenizers`` package (no transformers needed), or a
    ``tokenizers.Tokenizer`` built in memory (a GGUF file's, see :mod:`.gguf_tokenizer`).

    ``encode`` adds special tokens the way the file's post-processor says (a BOS for Llama), as
    transformers and vLLM do by default: a model trained with a BOS expects one.
    """

    def __init__(
        self, source: str | Path | Any, eos_token_id: int | None, chat_template: ChatTemplate | None = None
    ) -> None:
        if isinstance(source, (str, Path)):
            try:
                from tokenizers import Tokenizer as _Tokenizer
            except ImportError as e:
                raise ImportError(
                    f"reading {str(source)!r} needs the 'tokenizers' package (a minipaged dependency): "
                    "pip install tokenizers"
                ) from e
            source = _Tokenizer.from_file(str(source))
        self._tok = source
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` of every text, on all the machine's cores (the ``tokenizers`` package's threads)."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]

    @property
    def fingerprint(self) -> str:
        """sha256 of the whole tokenizer (vocabulary, merges, rules): equal fingerprints encode alike."""
        return hashlib.sha256(self._tok.to_str().encode()).hexdigest()


def load_tokenizer(folder: str | Path, eos_token_id: int | None) -> Tokenizer | None:
    """The folder's tokenizer, or None (prompts must then be token ids)."""
    folder = Path(folder)
    if (folder / "byte_tokenizer.json").exists():
        return ByteTokenizer.from_file(folder / "byte_tokenizer.json")
    if (folder / "tokenizer.json").exists():
        return HFTokenizer(folder / "tokenizer.json", eos_token_id, ChatTemplate.from_folder(folder))
    return None
