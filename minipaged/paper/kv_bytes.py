"""§3 of the paper: how many bytes of KV cache one token costs, from any ``config.json``.

Every layer keeps one key and one value vector per KV head for every token:
``2 x num_hidden_layers x num_key_value_heads x head_dim x bytes per number``. For OPT-13B in
fp16 (40 layers, hidden 5120, 40 heads of 128, no grouped-query attention) that is
2 x 40 x 5120 x 2 = 819,200 bytes: the paper's "800 KB per token", and 1.6 GB for a
2,048-token sequence. This needs only the config's numbers, so it reads any decoder family
(OPT included, which minipaged cannot run).
"""

from __future__ import annotations

import json
from pathlib import Path

from minipaged.model.random_models import RANDOM_MODELS
from minipaged.paper.report import PaperResult

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}
KIB, MIB = 1024, 1024**2  # the paper's "800 KB" is 800 KiB; its "1.6 GB" for 2,048 tokens is 1,600 MiB
PAPER = {"opt13b_kb_per_token": 800, "opt13b_2048_tokens_gb": 1.6}

# The paper's Table 1: an A100-40GB holding OPT-13B's 26 GB of weights keeps 12 GB for the KV
# cache. Read as 12 x 10^9 bytes, at 819,200 bytes a token: 14,648 tokens, 915 whole blocks of 16.
# (The table's "15.7K" slots read the same 12 GB as 12 GiB; seven 2,048-token reservations fit
# either way.)
A100_KV_BYTES = 12 * 10**9


def token_slots(kv_bytes: int, bytes_per_token: int, block_size: int = 16) -> int:
    """Token slots a KV budget holds, in whole blocks of ``block_size``."""
    return kv_bytes // bytes_per_token // block_size * block_size


# OPT-13B's config.json (facebook/opt-13b), the fields that size the KV cache.
OPT_13B = dict(model_type="opt", hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, torch_dtype="float16")


def kv_bytes_per_token(config: dict, dtype: str | None = None) -> int:
    """Bytes of K and V per token, all layers, for a ``config.json`` body (``dtype`` overrides its
    ``torch_dtype``/``dtype``; default fp32). Grouped-query models store ``num_key_value_heads``."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    dtype = dtype or config.get("torch_dtype") or config.get("dtype") or "float32"
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {sorted(DTYPE_BYTES)}")
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[dtype]


def kv_bytes_table(configs: list[str] | None = None, quick: bool = False) -> PaperResult:
    """OPT-13B beside the paper; SmolLM2-135M and the embedded model; any ``configs`` (paths) too."""
    from minipaged.model.loader import EMBEDDED_MODEL_DIR

    res = PaperResult("kv-bytes", "§3: KV cache bytes per token, from config.json", "computed", quick=quick)
    opt = kv_bytes_per_token(OPT_13B)
    res.add("OPT-13B fp16, KV per token", opt / KIB, f"{PAPER['opt13b_kb_per_token']} KB", "KiB")
    res.add("OPT-13B fp16, 2,048 tokens", 2048 * opt / MIB, f"{PAPER['opt13b_2048_tokens_gb']} GB", "MiB")
    models = {
        "OPT-13B (fp16)": (OPT_13B, None),
        "SmolLM2-135M (fp32, random:smollm2-135m)": (RANDOM_MODELS["smollm2-135m"], "float32"),
        "SmolLM2-135M (bf16)": (RANDOM_MODELS["smollm2-135m"], "bfloat16"),
        "embedded tiny model (fp32)": (json.loads((EMBEDDED_MODEL_DIR / "config.json").read_text()), "float32"),
    }
    for path in configs or []:
        models[str(path)] = (json.loads(Path(path).read_text()), None)
    res.data["bytes_per_token"] = {name: kv_bytes_per_token(cfg, dtype) for name, (cfg, dtype) in models.items()}
    for name, n in res.data["bytes_per_token"].items():
        if not name.startswith("OPT"):
            res.add(f"{name}, bytes per token", n, unit="B")
    res.notes.append("2 (K and V) x layers x KV heads x head_dim x bytes per number; no model is loaded")
    return res


A100_KV_SLOTS = token_slots(A100_KV_BYTES, kv_bytes_per_token(OPT_13B))  # 14,640
