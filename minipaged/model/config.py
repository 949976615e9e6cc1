"""Model configuration, read from a Hugging Face checkpoint folder (``config.json``).

minipaged runs four decoder families whose maths differ only in a few switches (Qwen3's per-head
query/key norm, Qwen2's fixed projection biases, ...). :meth:`ModelConfig.from_dict` reads those
switches the way transformers' own config class and model for that ``model_type`` read them,
including each family's defaults for absent fields, and **refuses** every field value that would
change the outputs in a way the decoder does not implement (a sliding window, an unknown
activation, a RoPE variant, quantized weights ...). A refused checkpoint costs a clear
``ValueError`` at load time; an accepted one computes the same logits as transformers.
docs/models.md lists what is supported and what is refused.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

SUPPORTED_MODEL_TYPES = ("qwen3", "llama", "qwen2", "mistral")
# The MLP's activation (``hidden_act``); the decoder maps each name to its function.
SUPPORTED_ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new", "relu")
# RoPE variants whose frequencies are fixed for all positions (see minipaged/model/rope.py).
# "dynamic" and "longrope" change them with the sequence length: refused.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ROPE_REQUIRED_KEYS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"), "yarn": ()}
ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}


class FamilyDefaults(TypedDict):
    """The fields a family's config class fills in when config.json omits them (None: derived or none)."""

    num_key_value_heads: int | None
    head_dim: int | None
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_id: int | None
    sliding_window: int | None


# What transformers' config class of each family assumes when config.json omits a field
# (tests/model/test_model_config.py checks these against the classes themselves).
FAMILY_DEFAULTS: dict[str, FamilyDefaults] = {
    "llama": FamilyDefaults(
        num_key_value_heads=None,
        head_dim=None,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        sliding_window=None,
    ),
    "mistral": FamilyDefaults(
        num_key_value_heads=8,
        head_dim=None,
        max_position_embeddings=131072,
        bos_token_id=1,
        eos_token_id=2,
        sliding_window=4096,
    ),
    "qwen2": FamilyDefaults(
        num_key_value_heads=32,
        head_dim=None,
        max_position_embeddings=32768,
        bos_token_id=None,
        eos_token_id=None,
        sliding_window=4096,
    ),
    "qwen3": FamilyDefaults(
        num_key_value_heads=32,
        head_dim=128,
        max_position_embeddings=32768,
        bos_token_id=None,
        eos_token_id=None,
        sliding_window=4096,
    ),
}
REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass(frozen=True)
class ModelConfig:
    """The numbers and switches a Qwen3 / Qwen2 / Llama / Mistral decoder needs.

    ``qk_norm`` is Qwen3's per-head RMSNorm on queries and keys (the others have none).
    ``attention_bias`` puts a bias on the q/k/v projections (and on o_proj, except in Qwen2).
    ``rope_scaling`` is None for plain RoPE, else the parameters of a RoPE variant with its
    ``rope_type`` (``{"rope_type": "llama3", "factor": 8.0, ...}``; see minipaged/model/rope.py).
    ``eos_token_ids`` holds every stop id (config.json and generation_config.json together);
    ``eos_token_id`` is the first of them (what a tokenizer calls its EOS), or None.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False)
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    eos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} is odd: RoPE rotates pairs of dimensions, it must be even")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"hidden_act={self.hidden_act!r} is not supported: "
                f"the MLP activation must be one of {SUPPORTED_ACTIVATIONS}"
            )
        # Keep the two EOS views consistent: eos_token_id first, then the other stop ids, no repeats.
        first = () if self.eos_token_id is None else (self.eos_token_id,)
        ids = tuple(dict.fromkeys((*first, *self.eos_token_ids)))
        object.__setattr__(self, "eos_token_ids", ids)
        object.__setattr__(self, "eos_token_id", ids[0] if ids else None)

    @classmethod
    def from_dict(cls, cfg: dict, generation_config: dict | None = None) -> ModelConfig:
        """Read a ``config.json`` body (and, when given, a ``generation_config.json`` body for stop ids).

        Raises ValueError naming the field for anything that changes the maths and is not implemented.
        """
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; minipaged loads {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        missing = [f for f in REQUIRED_FIELDS if cfg.get(f) is None]
        if missing:
            raise ValueError(f"config.json lacks {missing}: a {model_type} config needs {list(REQUIRED_FIELDS)}")
        defaults = FAMILY_DEFAULTS[model_type]
        heads = cfg["num_attention_heads"]
        max_pos = cfg.get("max_position_embeddings", defaults["max_position_embeddings"])
        _refuse_unsupported(cfg, model_type, max_pos)
        # Present-but-null means "derive it", absent means the family's default (as in transformers).
        kv_heads = cfg.get("num_key_value_heads", defaults["num_key_value_heads"])
        head_dim = cfg.get("head_dim", defaults["head_dim"])
        eos = _ids(cfg.get("eos_token_id", defaults["eos_token_id"]))
        if generation_config:
            eos += _ids(generation_config.get("eos_token_id"))
        rope_theta, rope_scaling = _rope(cfg, max_pos)
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads or heads,
            head_dim=head_dim or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=max_pos,
            hidden_act=cfg.get("hidden_act", "silu"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Each family's model decides which projections carry a bias, whatever else config.json says:
            # Qwen2 always biases q/k/v, Mistral never, Qwen3 reads attention_bias, Llama both flags.
            attention_bias={"qwen2": True, "mistral": False}.get(model_type, bool(cfg.get("attention_bias", False))),
            mlp_bias=model_type == "llama" and bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            eos_token_ids=tuple(eos),
            bos_token_id=cfg.get("bos_token_id", defaults["bos_token_id"]),
            pad_token_id=cfg.get("pad_token_id"),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        """``config.json``, plus the stop ids of ``generation_config.json`` when the folder has one."""
        folder = Path(folder)
        gen = folder / "generation_config.json"
        generation_config = json.loads(gen.read_text()) if gen.exists() else None
        return cls.from_dict(json.loads((folder / "config.json").read_text()), generation_config)

    def to_hf_dict(self) -> dict:
        """A ``config.json`` body that both minipaged and transformers read."""
        d = asdict(self)
        d.pop("qk_norm")
        ids = d.pop("eos_token_ids")
        d["eos_token_id"] = list(ids) if len(ids) > 1 else self.eos_token_id
        rope = d.pop("rope_scaling") or {"rope_type": "default"}
        d["rope_parameters"] = {**rope, "rope_theta": d.pop("rope_theta")}
        d["architectures"] = [ARCHITECTURES[self.model_type]]
        return d


def _ids(value: int | list[int] | None) -> list[int]:
    """An ``eos_token_id`` as a list: transformers allows an int, a list (Llama 3) or null."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"eos_token_id={value!r}: expected an int or a list of ints")
    return values


def _refuse(name: str, value: object, supported: str) -> ValueError:
    return ValueError(f"config.json field {name}={value!r} is not supported: {supported}")


def _refuse_unsupported(cfg: dict, model_type: str, max_pos: int) -> None:
    """Raise for a field value that changes the outputs and that minipaged's decoder does not implement."""
    if cfg.get("quantization_config"):
        method = cfg["quantization_config"].get("quant_method", "?")
        raise _refuse(
            "quantization_config",
            {"quant_method": method},
            "minipaged loads unquantized weights (fp32/fp16/bf16 safetensors) only",
        )
    window, layers = _sliding_window(cfg, model_type)
    if layers and window is not None and window < max_pos:
        name = "sliding_window" if model_type == "mistral" else "use_sliding_window=True with sliding_window"
        where = "every layer" if len(layers) == cfg["num_hidden_layers"] else f"layers {layers}"
        raise ValueError(
            f"config.json field {name}={window} (on {where}) is not supported: minipaged's attention sees every "
            f"earlier token, which equals a sliding window only when sliding_window >= max_position_embeddings "
            f"({max_pos})"
        )


def _sliding_window(cfg: dict, model_type: str) -> tuple[int | None, list[int]]:
    """(window, the layers transformers runs with a sliding-window mask of that width)."""
    layers = cfg["num_hidden_layers"]
    default = FAMILY_DEFAULTS[model_type]["sliding_window"]
    if model_type == "llama":  # Llama has no sliding window: transformers ignores the field
        return None, []
    if model_type == "mistral":  # one window for every layer, null = none
        window = cfg.get("sliding_window", default)
        return window, [] if window is None else list(range(layers))
    # Qwen2 / Qwen3: the window is on only with use_sliding_window, on the layers layer_types marks
    # (by default those from max_window_layers on).
    window = cfg.get("sliding_window", default) if cfg.get("use_sliding_window", False) else None
    types = cfg.get("layer_types")
    if types is not None:  # transformers still reads the legacy name "attention" as "full_attention"
        types = ["full_attention" if t == "attention" else t for t in types]
    else:
        start = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= start else "full_attention" for i in range(layers)]
    if len(types) != layers or any(t not in ("full_attention", "sliding_attention") for t in types):
        raise _refuse("layer_types", types, f"expected {layers} entries of 'full_attention' or 'sliding_attention'")
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding and window is None:
        raise ValueError(
            f"config.json field layer_types marks layers {sliding} 'sliding_attention' but use_sliding_window is "
            "false (no window): transformers cannot run this config either; mark them 'full_attention'"
        )
    return window, sliding


def _rope(cfg: dict, max_pos: int) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None), read as transformers 4 and 5 read them.

    transformers 5 writes ``rope_parameters`` (theta inside); older configs write ``rope_theta``
    at top level and an optional ``rope_scaling`` (which wins over ``rope_parameters``).
    """
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    if params and not any(k in params for k in ("rope_type", "type", "rope_theta")):
        raise _refuse("rope_parameters", params, "one RoPE for all layers, not one per layer type")
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    partial = params.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise _refuse("partial_rotary_factor", partial, "minipaged rotates the whole head (1.0)")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise _refuse("rope_type", rope_type, f"RoPE must be one of {SUPPORTED_ROPE_TYPES}")
    if rope_type == "default":
        return theta, None
    missing = [k for k in ROPE_REQUIRED_KEYS[rope_type] if params.get(k) is None]
    if missing:
        raise ValueError(f"config.json rope_type={rope_type!r} needs {missing} in rope_parameters (or rope_scaling)")
    if rope_type in ("llama3", "yarn"):
        # The pre-training context these variants stretch: a top-level field wins, else max_position_embeddings.
        original = cfg.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
        params["original_max_position_embeddings"] = original or max_pos
    if rope_type == "yarn" and params.get("factor") is None:
        params["factor"] = max_pos / params["original_max_position_embeddings"]
    return theta, {"rope_type": rope_type, **params}
