"""``EnginePlugins``: the engine calls its pieces through the plug-in points, and the defaults
are the package's own pieces."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from minipaged import LLM, SamplingParams
from minipaged.engine.plugins import EnginePlugins
from minipaged.engine.scheduler import Scheduler
from minipaged.kv.block_pool import BlockPool, fork_blocks
from minipaged.kv.prefix_cache import PrefixCache, chain_hashes, copy_on_write
from minipaged.kv.slot_mapping import build_slot_mapping

PREAMBLE = "Repeat the text exactly, please, as a copy machine would. "
PROMPTS = [PREAMBLE + "abc<copy>abc<end>", "xyz<copy>", PREAMBLE + "hello<copy>"]


def counted(calls: Counter, name: str, fn):
    def wrapper(*args, **kwargs):
        calls[name] += 1
        return fn(*args, **kwargs)

    return wrapper


def test_the_defaults_are_the_packages_pieces():
    p = EnginePlugins()
    assert p.block_pool is BlockPool and p.slot_mapping is build_slot_mapping and p.block_hashes is chain_hashes
    assert p.prefix_lookup is PrefixCache.find and p.copy_on_write is copy_on_write and p.fork is fork_blocks
    assert p.scheduler_policy is Scheduler.schedule_fcfs and p.attention_backend is None
    assert LLM(block_size=8).plugins == p


def test_every_piece_is_called_through_its_plug_in_point_and_changes_nothing():
    """The package's pieces, wrapped to count: the same tokens as the plain engine, every piece called."""
    kw = dict(block_size=8, num_kvcache_blocks=64, enable_prefix_caching=True, max_num_batched_tokens=32)
    params = [SamplingParams(temperature=0, max_tokens=6, n=2 if i == 1 else 1) for i in range(len(PROMPTS))]
    want = [[c.token_ids for c in o.outputs] for o in LLM(**kw).generate(PROMPTS, params, use_tqdm=False)]
    calls: Counter = Counter()
    base = EnginePlugins()
    names = [f.name for f in dataclasses.fields(base) if f.name != "attention_backend"]
    plugins = dataclasses.replace(base, **{n: counted(calls, n, getattr(base, n)) for n in names})
    llm = LLM(plugins=plugins, **kw)
    got = [[c.token_ids for c in o.outputs] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == want
    assert calls["block_pool"] == 1 and all(calls[n] > 0 for n in names), calls
    assert llm.kv_stats()["prefix_hit_tokens"] > 0 and llm.kv_stats()["cow_copies"] > 0


def test_plugins_must_be_engine_plugins():
    with pytest.raises(TypeError, match="EnginePlugins"):
        LLM(plugins={"slot_mapping": build_slot_mapping})
