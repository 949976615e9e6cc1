"""``ModelConfig``: each family read as transformers reads it, every output-changing field either
implemented or refused by name, and every stop id kept (config.json + generation_config.json)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from modelkit import HF_CLASSES

from minipaged.model.config import FAMILY_DEFAULTS, SUPPORTED_MODEL_TYPES, ModelConfig
from minipaged.model.loader import EMBEDDED_MODEL_DIR

transformers = pytest.importorskip("transformers")


def base(model_type: str, **fields) -> dict:
    """A small complete config.json body of one family."""
    return (
        dict(
            model_type=model_type,
            vocab_size=97,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
        )
        | fields
    )


# How minipaged treats each field of transformers' config classes of the four families. A field
# added by a future transformers fails test_every_transformers_field_is_accounted_for until it is
# read, refused or shown not to change outputs.
READ = {
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_parameters",
    "attention_bias",
    "mlp_bias",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
}
REFUSED_UNLESS_HARMLESS = {"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"}
# Training-only or cache switches; pretraining_tp only split matmuls in transformers 4 (same maths).
NO_EFFECT = {"initializer_range", "use_cache", "attention_dropout", "pretraining_tp"}


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_every_transformers_field_is_accounted_for(model_type):
    cls = getattr(transformers, f"{HF_CLASSES[model_type]}Config")
    generic = {f.name for f in dataclasses.fields(transformers.PreTrainedConfig)}
    own = {f.name for f in dataclasses.fields(cls)} - generic
    assert own - READ - REFUSED_UNLESS_HARMLESS - NO_EFFECT == set()


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_family_defaults_are_transformers_defaults(model_type):
    """A field missing from config.json means what it means to transformers' class for that family."""
    cls = getattr(transformers, f"{HF_CLASSES[model_type]}Config")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    assert {k: defaults.get(k) for k in FAMILY_DEFAULTS[model_type]} == FAMILY_DEFAULTS[model_type]
    # ... and from_dict applies them: a config.json with only the required fields.
    cfg = dict(
        model_type=model_type,
        vocab_size=97,
        hidden_size=256,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=32,
    )
    if model_type == "mistral":
        cfg["sliding_window"] = None  # its default window (4096) is narrower than its default context
    ours, theirs = ModelConfig.from_dict(cfg), cls(**cfg)
    assert ours.num_key_value_heads == theirs.num_key_value_heads
    assert ours.head_dim == (getattr(theirs, "head_dim", None) or 256 // 32)
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    assert ours.eos_token_id == theirs.eos_token_id and ours.bos_token_id == theirs.bos_token_id


# (model_type, config.json fields, the message naming the field and its value)
REFUSED = [
    ("llama", dict(hidden_act="gelu_10"), "hidden_act='gelu_10' is not supported"),
    ("qwen3", dict(hidden_act="quick_gelu"), "hidden_act='quick_gelu' is not supported"),
    ("mistral", dict(sliding_window=16), r"sliding_window=16 \(on every layer\) is not supported"),
    ("mistral", dict(max_position_embeddings=None), "sliding_window=4096"),  # both defaults: 4096 < 131072
    (
        "qwen3",
        dict(use_sliding_window=True, sliding_window=16, max_window_layers=2),
        r"use_sliding_window=True with sliding_window=16 \(on layers \[2, 3\]\)",
    ),
    (
        "qwen2",
        dict(use_sliding_window=True, sliding_window=16, max_window_layers=0),
        "use_sliding_window=True with sliding_window=16",
    ),
    (
        "qwen3",
        dict(use_sliding_window=True, sliding_window=16, layer_types=["sliding_attention"] + ["full_attention"] * 3),
        r"layers \[0\]",
    ),
    ("qwen3", dict(layer_types=["sliding_attention"] * 4), "layer_types marks layers"),
    ("qwen3", dict(layer_types=["full_attention"] * 3), "layer_types="),
    ("qwen2", dict(layer_types=["chunked_attention"] * 4), "layer_types="),
    ("llama", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), "rope_type='dynamic'"),
    ("llama", dict(rope_scaling={"type": "longrope", "factor": 2.0}), "rope_type='longrope'"),
    (
        "llama",
        dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
        "partial_rotary_factor=0.5",
    ),
    ("qwen3", dict(partial_rotary_factor=0.25), "partial_rotary_factor=0.25"),
    (
        "llama",
        dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}),
        r"rope_type='llama3' needs \['low_freq_factor', 'high_freq_factor'\]",
    ),
    (
        "llama",
        dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
        "rope_parameters=.* one RoPE for all layers",
    ),
    ("llama", dict(quantization_config={"quant_method": "awq", "bits": 4}), "quantization_config=.*awq"),
    ("gemma2", {}, "unsupported model_type 'gemma2'"),
    ("llama", dict(vocab_size=None), r"config.json lacks \['vocab_size'\]"),
    ("llama", dict(num_key_value_heads=3), "multiple of num_key_value_heads"),
    ("llama", dict(head_dim=15), "head_dim=15 is odd"),
    ("llama", dict(eos_token_id="</s>"), "eos_token_id='</s>'"),
]


@pytest.mark.parametrize(("model_type", "fields", "match"), REFUSED)
def test_unsupported_fields_are_refused_by_name(model_type, fields, match):
    cfg = {k: v for k, v in base(model_type, **fields).items() if v is not None or k == "sliding_window"}
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict(cfg)


# Values that look like the refused ones but compute the same as full attention / plain settings.
ACCEPTED = [
    ("mistral", dict(sliding_window=256)),  # window >= max_position_embeddings: sees everything anyway
    ("mistral", dict(sliding_window=None)),
    ("qwen3", dict(use_sliding_window=False, sliding_window=16)),  # off: transformers nulls it
    ("qwen2", dict(use_sliding_window=True, sliding_window=16, max_window_layers=4)),  # no layer reaches it
    ("qwen3", dict(use_sliding_window=True, sliding_window=4096)),
    ("qwen3", dict(layer_types=["attention"] * 4)),  # the legacy name of full_attention
    ("llama", dict(sliding_window=16)),  # Llama has no window: transformers ignores the field
    ("llama", dict(pretraining_tp=4, attention_dropout=0.1, use_cache=False)),
    ("llama", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0})),
]


@pytest.mark.parametrize(("model_type", "fields"), ACCEPTED)
def test_harmless_values_are_accepted(model_type, fields):
    assert ModelConfig.from_dict(base(model_type, **fields)).model_type == model_type


def test_biases_follow_each_family_not_the_flags():
    """transformers' Qwen2 always biases q/k/v (never o), Mistral never, Qwen3 and Llama read the flags."""
    flags = dict(attention_bias=True, mlp_bias=True)
    got = {
        t: (c.attention_bias, c.mlp_bias)
        for t in SUPPORTED_MODEL_TYPES
        for c in [ModelConfig.from_dict(base(t, **flags))]
    }
    assert got == {"llama": (True, True), "qwen3": (True, False), "qwen2": (True, False), "mistral": (False, False)}
    assert ModelConfig.from_dict(base("qwen2", attention_bias=False)).attention_bias


def test_rope_fields_old_and_new_spellings():
    linear = {"rope_type": "linear", "factor": 2.0}
    new = ModelConfig.from_dict(base("llama", rope_parameters={**linear, "rope_theta": 5e5}))
    old = ModelConfig.from_dict(base("llama", rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}))
    assert new == old and new.rope_theta == 5e5 and new.rope_scaling == linear
    assert ModelConfig.from_dict(base("qwen3", rope_theta=1e6)).rope_scaling is None
    llama3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    c = ModelConfig.from_dict(base("llama", rope_parameters=llama3))
    assert c.rope_scaling["original_max_position_embeddings"] == 256  # defaults to max_position_embeddings
    c = ModelConfig.from_dict(base("llama", rope_parameters=llama3, original_max_position_embeddings=64))
    assert c.rope_scaling["original_max_position_embeddings"] == 64
    yarn = {"rope_type": "yarn", "original_max_position_embeddings": 64}
    yarn = ModelConfig.from_dict(base("qwen3", rope_parameters=yarn))
    assert yarn.rope_scaling["factor"] == 4.0  # max_position_embeddings / original, as transformers infers it


@pytest.mark.parametrize(
    ("config_eos", "generation_eos", "expected"),
    [
        (2, None, (2,)),
        ([128001, 128008, 128009], None, (128001, 128008, 128009)),  # Llama 3 style list
        (128001, [128001, 128009], (128001, 128009)),  # generation_config.json adds a stop id
        (None, 7, (7,)),
        (None, None, ()),
    ],
)
def test_every_stop_id_is_kept(tmp_path, config_eos, generation_eos, expected):
    (tmp_path / "config.json").write_text(json.dumps(base("qwen3", eos_token_id=config_eos)))
    if generation_eos is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    cfg = ModelConfig.from_folder(tmp_path)
    assert cfg.eos_token_ids == expected
    assert cfg.eos_token_id == (expected[0] if expected else None)


def test_eos_views_agree_when_built_directly():
    kw = dict(
        model_type="qwen3",
        vocab_size=9,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
    )
    assert ModelConfig(**kw, eos_token_id=5).eos_token_ids == (5,)
    assert ModelConfig(**kw, eos_token_ids=(3, 4)).eos_token_id == 3
    assert ModelConfig(**kw, eos_token_id=5, eos_token_ids=(3, 5)).eos_token_ids == (5, 3)


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig.from_json(EMBEDDED_MODEL_DIR / "config.json"),
        ModelConfig.from_dict(
            base(
                "llama",
                eos_token_id=[5, 6],
                hidden_act="gelu",
                attention_bias=True,
                rope_parameters={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "rope_theta": 5e5,
                },
            )
        ),
    ],
    ids=["embedded", "llama3"],
)
def test_to_hf_dict_round_trips_through_minipaged_and_transformers(cfg):
    d = cfg.to_hf_dict()
    assert ModelConfig.from_dict(d) == cfg
    theirs = transformers.AutoConfig.for_model(**d)
    assert type(theirs).__name__ == f"{HF_CLASSES[cfg.model_type]}Config"
    assert theirs.rope_parameters == {**(cfg.rope_scaling or {"rope_type": "default"}), "rope_theta": cfg.rope_theta}
    assert (theirs.hidden_act, theirs.head_dim) == (cfg.hidden_act, cfg.head_dim)
    assert theirs.eos_token_id == d["eos_token_id"]
