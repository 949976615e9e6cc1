"""Fixtures for the real chat model, read from its GGUF file (fetched once into the cache by name),
and transformers reading the same file: the independent reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minipaged.model import hub

SHAREGPT_CONVERSATIONS = 1200  # read from the start of the file: a few thousand turns


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return hub.fetch(hub.DEFAULT_CHAT_MODEL)


@pytest.fixture(scope="session")
def sharegpt_turns() -> list[str]:
    """The turns (human and model) of the first ShareGPT conversations, in file order.

    The packaged file is cut mid-record, so it is read one record at a time.
    """
    text = hub.fetch("sharegpt").read_text(encoding="utf-8", errors="replace")
    decoder, pos, turns = json.JSONDecoder(), text.index("[") + 1, []
    for _ in range(SHAREGPT_CONVERSATIONS):
        while text[pos] in " \n\r\t,":
            pos += 1
        record, pos = decoder.raw_decode(text, pos)
        turns += [t["value"] for t in record.get("conversations", []) if t.get("value")]
    return turns


@pytest.fixture(scope="session")
def hf_gguf_tokenizer(gguf_path):
    """transformers' own tokenizer for the GGUF (about 15-40 s to build: once per test session)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


@pytest.fixture(scope="session")
def hf_gguf_model(gguf_path):
    """transformers' Llama with the GGUF's weights dequantized to fp32 by transformers' own code."""
    import torch

    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
