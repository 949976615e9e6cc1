"""Shared fixtures: tiny random Hugging Face checkpoints saved to disk, loaded by minipaged."""

from __future__ import annotations

import pytest
import torch
from modelkit import make_hf_model

PROMPT_LENGTHS = (3, 17, 9, 30)


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def hf_checkpoint(request, tmp_path_factory):
    """(transformers model, folder it was saved to) for each supported family."""
    model = make_hf_model(request.param, tie=request.param == "llama")
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="session")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 97, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Qwen3 checkpoint folder (vocab 97, no tokenizer): prompts are token ids."""
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    make_hf_model("qwen3").save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def real_model() -> str:
    """What ``LLM(...)`` is given to load the real chat model (SmolLM2-135M-Instruct): its name, so
    the GGUF comes from the cache (fetched there once)."""
    import os

    from minipaged.model.hub import DEFAULT_CHAT_MODEL

    return os.environ.get("MINIPAGED_TEST_REAL_MODEL", DEFAULT_CHAT_MODEL)
