"""Read a GGUF file (llama.cpp's format): its metadata as a model config, its tensors dequantized.

A GGUF file is one self-describing binary: a header (the magic ``GGUF``, a version, counts),
typed key/value metadata (``llama.block_count = 30``, ``tokenizer.ggml.tokens = [...]``) and
tensors, many of them quantized in blocks (``Q4_1``: 32 weights share a scale and a minimum).
The ``gguf`` package (the format's own Python reader) memory-maps the file and dequantizes every
block type; this module adds what a faithful load needs on top of it:

1. **The layout, checked first** (:func:`check_header`, then :mod:`.gguf_checks`): a file that is
   not a GGUF, is cut short or claims more than it holds gets a clear error naming the file and
   what is wrong, instead of a numpy traceback, a hang or gigabytes allocated.
2. **Every metadata key classified** (:func:`classify`), as docs/models.md classifies
   ``config.json`` fields: *implemented* (read into the config or the tokenizer), *ignored*
   (it does not change the outputs: a licence, a name, how a quantization was calibrated) or
   *refused* with a ``ValueError`` naming it (it changes the maths and is not implemented). A key
   minipaged does not know is refused: it might change the maths.
3. **The config** goes through :meth:`ModelConfig.from_dict` as a ``config.json``-style dict, so
   the same checks apply as for a Hugging Face folder.
4. **Tensors**: names mapped to the decoder's (``blk.3.attn_q.weight`` ->
   ``model.layers.3.self_attn.q_proj.weight``), shapes read from the metadata so they can be
   checked before anything is dequantized, then ``gguf.quants.dequantize`` to fp32, and
   llama.cpp's row order of Q and K undone (see :func:`unpermute_qk`).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minipaged.model.config import ModelConfig
from minipaged.model.gguf_checks import check_layout

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
SUPPORTED_ARCHITECTURES = ("llama",)
# Block types dequantized by ``gguf.quants`` and read here (the SmolLM2 file holds Q4_1, Q8_0, F32).
SUPPORTED_TENSOR_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)

# ``{arch}.KEY`` -> the config.json field it becomes.
CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
}
# ``{arch}.KEY`` that are sizes or counts: a damaged file can say 0 (a division by zero later) or 2^31
# (a model of 2^31 layers built before any tensor is compared).
SIZE_KEYS = (
    "vocab_size",
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
)
# ``{arch}.KEY`` that must equal the head size: a smaller value would be partial RoPE / a narrower V.
HEAD_DIM_KEYS = ("rope.dimension_count", "attention.value_length")
REQUIRED_KEYS = (
    "block_count",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.layer_norm_rms_epsilon",
)
# Read by the tokenizer (minipaged/model/gguf_tokenizer.py).
TOKENIZER_KEYS = tuple(
    f"tokenizer.ggml.{k}"
    for k in (
        "model",
        "pre",
        "tokens",
        "token_type",
        "merges",
        "bos_token_id",
        "eos_token_id",
        "eot_token_id",
        "eom_token_id",
        "unknown_token_id",
        "padding_token_id",
        "add_bos_token",
        "add_eos_token",
        "add_space_prefix",
    )
) + ("tokenizer.chat_template",)
# Keys that do not change the outputs, and why.
IGNORED = {
    "general.": "describes the file (name, licence, languages, file type, quantization version ...)",
    "GGUF.": "the header's counts, read by the gguf reader",
    "quantize.imatrix.": "how the quantization was calibrated; the stored weights are what they are",
    "tokenizer.ggml.scores": "sentencepiece scores; a byte-level BPE merges by rank",
    "tokenizer.ggml.seperator_token_id": "an encoder's separator; not used to generate",
    "tokenizer.ggml.cls_token_id": "an encoder's classification token; not used to generate",
    "tokenizer.ggml.mask_token_id": "an encoder's mask token; not used to generate",
    "tokenizer.chat_template.": "named extra templates; the default one is read",
    "tokenizer.huggingface.json": "a tokenizer copy; tokenizer.ggml keys are read instead, as llama.cpp does",
}
# "{arch}." keys refused unless they hold the value that means "off".
OFF_VALUES = {"rope.scaling.type": ("none",), "expert_count": (0,), "expert_used_count": (0,)}
GGUF_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
GGUF_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def check_header(path: Path) -> None:
    """Raise a clear error for a missing file, a file that is not a GGUF, or one cut inside its header."""
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    with open(path, "rb") as f:
        head = f.read(24)  # magic, uint32 version, uint64 tensor count, uint64 key/value count
    if head[:4] != MAGIC:
        raise ValueError(f"{str(path)!r} is not a GGUF file: it starts with {head[:4]!r}, a GGUF file with {MAGIC!r}")
    if len(head) < 24:
        raise ValueError(f"{str(path)!r} is truncated: {len(head)} bytes, shorter than a GGUF header (24)")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"{str(path)!r} is GGUF version {version}; minipaged reads versions {SUPPORTED_VERSIONS}")


def open_gguf(path: Path) -> Any:
    """A ``gguf.GGUFReader`` over the file (memory-mapped: nothing large is read yet).

    The gguf package trusts every count and length in the file; :func:`.gguf_checks.check_layout`
    checks them all against the file's size first, so a damaged file gets one clear ``ValueError``.
    """
    import gguf

    check_header(path)
    check_layout(path)
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # a fault the layout checks do not know: still an error that names the file
        raise ValueError(
            f"{str(path)!r} is truncated or corrupt (the gguf reader says: {type(e).__name__}: {e}); fetch it again"
        ) from e


def metadata(reader: Any) -> dict[str, Any]:
    """Every key's value as a Python object (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def classify(key: str, value: object, arch: str) -> str:
    """``"config"``, ``"tokenizer"`` or ``"ignored"``; raises ValueError for a refused key."""
    short = key.removeprefix(f"{arch}.") if key.startswith(f"{arch}.") else ""  # "" for keys of other prefixes
    if key == "general.architecture" or short in CONFIG_KEYS:
        return "config"
    if key in TOKENIZER_KEYS:
        return "tokenizer"
    if any(key == k or (k.endswith(".") and key.startswith(k)) for k in IGNORED):
        return "ignored"
    if short in HEAD_DIM_KEYS:
        return "config"  # checked against the head size by config_dict
    if short in OFF_VALUES:
        if value in OFF_VALUES[short]:
            return "ignored"
        raise ValueError(
            f"GGUF key {key}={value!r} is not supported: minipaged runs a dense model with plain RoPE "
            f"({key} must be {OFF_VALUES[short][0]!r})"
        )
    if short.startswith("rope.scaling."):
        return "ignored"  # parameters of a RoPE scaling that rope.scaling.type switches on (refused there)
    raise ValueError(
        f"GGUF key {key}={_short(value)} is not supported: minipaged does not know what it changes "
        "(see docs/models.md, GGUF)"
    )


def config_dict(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """The ``config.json`` body the metadata describes (every key classified on the way)."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported: minipaged reads {SUPPORTED_ARCHITECTURES}")
    for key, value in meta.items():
        classify(key, value, arch)
    missing = [f"{arch}.{k}" for k in REQUIRED_KEYS if f"{arch}.{k}" not in meta]
    if missing:
        raise ValueError(f"GGUF metadata lacks {missing}")
    check_sizes(meta, arch, tensor_names)
    cfg: dict[str, Any] = {"model_type": arch, "hidden_act": "silu", "rope_theta": 10000.0}
    cfg |= {field: meta[f"{arch}.{key}"] for key, field in CONFIG_KEYS.items() if f"{arch}.{key}" in meta}
    cfg.setdefault("vocab_size", len(meta.get("tokenizer.ggml.tokens", ())) or None)
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    for key in HEAD_DIM_KEYS:
        if meta.get(f"{arch}.{key}", cfg["head_dim"]) != cfg["head_dim"]:
            raise ValueError(
                f"GGUF key {arch}.{key}={meta[f'{arch}.{key}']} is not supported: minipaged needs it "
                f"equal to the head size {cfg['head_dim']} (whole-head RoPE, K and V of one size)"
            )
    cfg["tie_word_embeddings"] = "output.weight" not in tensor_names  # llama.cpp omits a tied lm_head
    stops = [
        meta[f"tokenizer.ggml.{k}_token_id"] for k in ("eos", "eot", "eom") if f"tokenizer.ggml.{k}_token_id" in meta
    ]
    cfg["eos_token_id"] = list(dict.fromkeys(stops)) or None
    cfg["bos_token_id"] = meta.get("tokenizer.ggml.bos_token_id")
    cfg["pad_token_id"] = meta.get("tokenizer.ggml.padding_token_id")
    return cfg


def check_sizes(meta: dict[str, Any], arch: str, tensor_names: set[str]) -> None:
    """Every size key a positive integer, and ``{arch}.block_count`` the number of blocks the file has tensors of."""
    for key in SIZE_KEYS:
        value = meta.get(f"{arch}.{key}", 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"GGUF key {arch}.{key}={_short(value)} is not a size: it must be a positive integer")
    blocks = {m.group(1) for m in map(_BLOCK.fullmatch, tensor_names) if m}
    if meta[f"{arch}.block_count"] != len(blocks):
        raise ValueError(
            f"GGUF key {arch}.block_count={meta[f'{arch}.block_count']}, but the file holds the tensors of "
            f"{len(blocks)} blocks (blk.N.*)"
        )


def read_config(reader: Any) -> ModelConfig:
    return ModelConfig.from_dict(config_dict(metadata(reader), {t.name for t in reader.tensors}))


def hf_name(gguf_name: str) -> str:
    """The decoder's state-dict name of a GGUF tensor; ValueError for one the decoder does not have."""
    base, _, kind = gguf_name.rpartition(".")
    if kind in ("weight", "bias") and base in GGUF_TENSOR_NAMES:
        return f"{GGUF_TENSOR_NAMES[base]}.{kind}"
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in GGUF_BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{GGUF_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    raise ValueError(f"GGUF tensor {gguf_name} is not one a llama decoder has; minipaged cannot place it")


def tensor_shapes(reader: Any) -> dict[str, torch.Tensor]:
    """Each tensor as an empty meta tensor of its shape, under its decoder name (types checked too)."""
    shapes = {}
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TENSOR_TYPES:
            raise ValueError(
                f"GGUF tensor {t.name} has type {t.tensor_type.name}; minipaged reads "
                f"{', '.join(SUPPORTED_TENSOR_TYPES)}"
            )
        # GGUF lists dimensions fastest-first (ggml's ne[]): [576, 49152] is a [49152, 576] matrix.
        shapes[hf_name(t.name)] = torch.empty([int(n) for n in reversed(t.shape)], device="meta")
    return shapes


def read_tensors(reader: Any, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to fp32 under its decoder name, Q and K rows back in Hugging Face order."""
    from gguf.quants import dequantize

    tensors = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        shape = [int(n) for n in reversed(t.shape)]
        w = torch.from_numpy(
            np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
        )  # a copy: the file is read-only
        w = w.reshape(shape)
        if ".q_proj." in name:
            w = unpermute_qk(w, cfg.num_attention_heads)
        elif ".k_proj." in name:
            w = unpermute_qk(w, cfg.num_key_value_heads)
        tensors[name] = w
    return tensors


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's row order of a Q or K projection (``[num_heads * head_dim, ...]``).

    Hugging Face's RoPE rotates dimension ``i`` with ``i + head_dim / 2`` (two halves); llama.cpp's
    rotates neighbours ``2i`` and ``2i + 1``. Its converter therefore interleaves each head's two
    halves: row ``j`` of the first half goes to ``2j``, row ``j`` of the second half to ``2j + 1``.
    Reading ``[heads, half, 2, ...]`` and swapping to ``[heads, 2, half, ...]`` puts the halves back.
    """
    rows = w.shape[0]
    half = rows // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
