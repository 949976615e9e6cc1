"""minipaged: vLLM-style PagedAttention rebuilt stage by stage.

Stage 0 :mod:`minipaged.kv.contiguous` · 1 :mod:`minipaged.kv.block_pool` · 2 :mod:`minipaged.kv.block_table`
· 3 :mod:`minipaged.kv.slot_mapping` · 4 :mod:`minipaged.kernels` · 5 :mod:`minipaged.engine`
· 6 :mod:`minipaged.kv.prefix_cache`. The engine's entry point is :class:`LLM`.
"""

import logging

from minipaged.engine.beam_search import BeamSearchOutput, BeamSearchSequence
from minipaged.engine.llm import LLM
from minipaged.engine.outputs import CompletionOutput, RequestOutput
from minipaged.engine.sampling_params import BeamSearchParams, SamplingParams
from minipaged.kv.block_pool import BlockPool, NoFreeBlocksError
from minipaged.kv.block_table import BlockTable
from minipaged.kv.contiguous import ContiguousKVCache, FirstFitArena
from minipaged.kv.kv_cache_block import KVCacheBlock
from minipaged.kv.paged_cache import PagedKVCache
from minipaged.kv.prefix_cache import PrefixCache
from minipaged.model.loader import load_model

__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "BeamSearchParams",
    "BeamSearchOutput",
    "BeamSearchSequence",
    "BlockPool",
    "KVCacheBlock",
    "NoFreeBlocksError",
    "BlockTable",
    "ContiguousKVCache",
    "FirstFitArena",
    "PagedKVCache",
    "PrefixCache",
    "load_model",
]
__version__ = "0.3.0"

# Like vLLM, say what the engine chose (e.g. the KV pool's size) unless the user set up logging.
_log = logging.getLogger("minipaged")
if not _log.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("minipaged: %(message)s"))
    _log.addHandler(_handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False
