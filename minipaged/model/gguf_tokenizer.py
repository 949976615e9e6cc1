"""A GGUF file's tokenizer, rebuilt from its metadata with the ``tokenizers`` package.

A GGUF has no ``tokenizer.json``: it stores the vocabulary (``tokenizer.ggml.tokens``, in id
order), the BPE merges (``tokenizer.ggml.merges``, best first), each token's kind
(``tokenizer.ggml.token_type``: 1 normal, 3 control such as ``<|im_end|>``, 4 user-defined) and
the special ids. ``tokenizer.ggml.model = gpt2`` is a byte-level BPE: text is cut into pieces by
the pre-tokenizer's regex named by ``tokenizer.ggml.pre``, each piece's UTF-8 bytes are spelled
as printable characters (GPT-2's byte alphabet: byte 32, a space, is ``Ġ``), and merges join them.
Control tokens are matched whole before that (they never come out of merges), and decoding maps
the byte alphabet back to bytes. Built like this the tokenizer gives the ids transformers' GGUF
tokenizer gives (tests/model/test_gguf_tokenizer.py checks it on ShareGPT text).
"""

from __future__ import annotations

from typing import Any

from minipaged.model.chat_template import ChatTemplate
from minipaged.model.tokenizer import HFTokenizer

CONTROL, USER_DEFINED = 3, 4
# tokenizer.ggml.pre values whose split is GPT-2's own regex (ByteLevel's built-in one):
# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
GPT2_SPLIT_PRE = ("smollm", "gpt-2")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte: printable Latin-1 stays itself, the rest move to 256+."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in spelling:
            spelling[b], extra = chr(256 + extra), extra + 1
    return spelling


def build_tokenizer(meta: dict[str, Any], eos_token_id: int | None) -> HFTokenizer:
    """The tokenizer the metadata describes, with the chat template of ``tokenizer.chat_template``.

    Raises ValueError for a tokenizer kind or pre-tokenizer minipaged does not build.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "gpt-2")
    if kind != "gpt2":
        raise ValueError(
            f"GGUF key tokenizer.ggml.model={kind!r} is not supported: minipaged builds 'gpt2' "
            "(byte-level BPE) tokenizers"
        )
    if pre not in GPT2_SPLIT_PRE:
        raise ValueError(
            f"GGUF key tokenizer.ggml.pre={pre!r} is not supported: minipaged knows the split of {GPT2_SPLIT_PRE}"
        )
    if meta.get("tokenizer.ggml.add_space_prefix"):
        raise ValueError("GGUF key tokenizer.ggml.add_space_prefix=True is not supported for a byte-level BPE")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    # A token written in plain text rather than the byte alphabet (it happens) is respelled byte by byte.
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode()): i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", ())]
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Control tokens outside the byte alphabet would be new ids past the model's vocabulary: skipped.
    tok.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, k in zip(tokens, types)
            if k == CONTROL and set(t) <= alphabet
        ]
    )
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab])
    name = {key: tokens[meta[f"tokenizer.ggml.{key}_token_id"]] if f"tokenizer.ggml.{key}_token_id" in meta else None
            for key in ("bos", "eos", "unknown", "padding")}  # fmt: skip
    single = ["$A"]
    if meta.get("tokenizer.ggml.add_bos_token") and name["bos"]:
        single.insert(0, name["bos"])
    if meta.get("tokenizer.ggml.add_eos_token") and name["eos"]:
        single.append(name["eos"])
    specials = [(t, vocab[t]) for t in single if t != "$A"]
    tok.post_processor = processors.TemplateProcessing(single=" ".join(single), special_tokens=specials)
    source = meta.get("tokenizer.chat_template")
    special = {
        "bos_token": name["bos"],
        "eos_token": name["eos"],
        "pad_token": name["padding"],
        "unk_token": name["unknown"],
    }
    template = ChatTemplate(source, {k: v or "" for k, v in special.items()}) if source else None
    return HFTokenizer(tok, eos_token_id, template)
