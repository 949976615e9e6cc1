"""Random-weight models with real models' shapes, built in-process: ``LLM("random:smollm2-135m")``.

What a model *says* does not matter to memory or to speed; its **shape** does. A decode step of
SmolLM2-135M (134.5M parameters, 538 MB in fp32) reads every weight once, more than this CPU's
caches hold, so the step costs about the same for 1 row as for 16: that is the regime a GPU
serves in, where paging's bigger batches turn into throughput. The embedded 2M-parameter model
fits in cache and is compute-bound instead (docs/paper.md compares the two).

A random model needs no download and no tokenizer: prompts are token ids, and it has no EOS, so
every request runs to its ``max_tokens`` (the paper's traces fix output lengths the same way).
Weights are drawn from one seeded generator in a fixed order, so two builds give the same logits.
Hugging Face's default init (std 0.02) makes a random deep model repeat one token whatever the
context; a larger std and random norm weights give tokens that depend on the context.

``RANDOM_MODELS`` maps each name to a ``config.json`` body; add a shape by adding an entry.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TypeGuard

import numpy as np
import torch

from minipaged.model.config import ModelConfig
from minipaged.model.decoder import DecoderModel

PREFIX = "random:"
INIT_STD = 0.5  # std of every matrix: large enough that each layer changes the next token
SEED = 0
BYTE_STD = ((256**2 - 1) / 12) ** 0.5  # std of a uniform random byte, -128..127

# SmolLM2-135M's config.json (HuggingFaceTB/SmolLM2-135M), less its token ids: no tokenizer, no EOS.
RANDOM_MODELS: dict[str, dict] = {
    "smollm2-135m": dict(
        model_type="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        hidden_act="silu",
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    ),
}


def is_random_model(path: object) -> TypeGuard[str]:
    """Whether ``path`` names a random model (``"random:NAME"``) rather than a folder."""
    return isinstance(path, str) and path.startswith(PREFIX)


def random_model_config(name: str) -> ModelConfig:
    """The :class:`ModelConfig` of ``"random:NAME"`` (or ``"NAME"``); ValueError lists the known names."""
    key = name.removeprefix(PREFIX)
    if key not in RANDOM_MODELS:
        raise ValueError(f"unknown random model {name!r}: known are {', '.join(PREFIX + k for k in RANDOM_MODELS)}")
    return ModelConfig.from_dict(RANDOM_MODELS[key])


def build_random_model(
    name: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", seed: int = SEED
) -> DecoderModel:
    """The model ``"random:NAME"`` with seeded random weights, in ``dtype`` on ``device``, in eval mode.

    Built once per process and (name, dtype, device, seed): every ``LLM`` of the same model
    shares the weights, read-only (building 134.5M parameters costs a few seconds on a CPU).
    """
    random_model_config(name)  # an unknown name fails here, with the name as given
    return _build(name.removeprefix(PREFIX), dtype, str(torch.device(device)), seed)


@lru_cache(maxsize=2)
def _build(key: str, dtype: torch.dtype, device: str, seed: int) -> DecoderModel:
    cfg = random_model_config(key)
    with torch.device("meta"):  # no default init: every weight is drawn once, below
        model = DecoderModel(cfg)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, p in model.named_parameters():  # a fixed order (tied weights once): same seed, same weights
        # Random bytes are the cheapest random numbers here (134.5M normals take ~3x longer).
        levels = torch.from_numpy(rng.integers(-128, 128, size=tuple(p.shape), dtype=np.int8)).to(torch.float32)
        if "norm" in name:  # transformers starts norm weights at 1: here a random scale per channel in [0.5, 1.5]
            weights[name] = levels.add_(128.0).div_(255.0).add_(0.5)
        else:  # uniform, mean 0, std INIT_STD
            weights[name] = levels.mul_(INIT_STD / BYTE_STD)
    if cfg.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    # As the loader does: assign real tensors to the meta parameters, then tie again.
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval().requires_grad_(False)
