"""Load a Hugging Face checkpoint folder (``config.json`` + ``*.safetensors``) from local disk."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from minipaged.config import ModelConfig
from minipaged.model.decoder import DecoderModel
from minipaged.model.tokenizer import Tokenizer, load_tokenizer

EMBEDDED_MODEL_DIR = Path(__file__).parents[1] / "tiny" / "assets" / "tiny-copy"


def load_model(
    path: str | Path | None = None, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> tuple[DecoderModel, Tokenizer | None]:
    """Build the decoder and load its weights; ``path=None`` is the embedded tiny model.

    Shards (``model-00001-of-00002.safetensors`` ...) are all read. Errors name the problem: a
    missing folder or file, an unsupported ``model_type``, a missing, unexpected or mis-shaped tensor.
    """
    folder = Path(path) if path is not None else EMBEDDED_MODEL_DIR
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {str(folder)!r} does not exist")
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{str(folder)!r} has no config.json")
    cfg = ModelConfig.from_json(folder / "config.json")
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{str(folder)!r} has no *.safetensors weights")

    with torch.device("meta"):
        model = DecoderModel(cfg)
    expected = {name: p.shape for name, p in model.named_parameters()}  # tied weights appear once
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                if name.endswith("rotary_emb.inv_freq"):
                    continue  # a buffer some exporters save; RoPE is recomputed here
                tensors[name] = f.get_tensor(name)
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        raise ValueError(f"checkpoint {str(folder)!r} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    if unexpected:
        raise ValueError(f"checkpoint {str(folder)!r} has {len(unexpected)} unknown tensors, e.g. {unexpected[:3]}")
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise ValueError(f"tensor {name} has shape {tuple(tensors[name].shape)}, the config implies {tuple(shape)}")
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # RoPE buffers were created on the meta device; rebuild them for real.
    for layer in model.model.layers:
        rot = layer.self_attn.rotary
        rot.inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
    model = model.to(device).eval()
    return model, load_tokenizer(folder, cfg.eos_token_id)
