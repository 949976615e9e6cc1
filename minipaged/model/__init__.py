"""The decoder (:mod:`.decoder`, RoPE in :mod:`.rope`), checkpoint loading (:mod:`.loader`) and tokenizers."""

from minipaged.model.decoder import DecoderModel
from minipaged.model.loader import EMBEDDED_MODEL_DIR, load_model

__all__ = ["DecoderModel", "EMBEDDED_MODEL_DIR", "load_model"]
