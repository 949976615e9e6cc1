"""Render functions: a Figure with the expected artists for a small state, saved as PNG and SVG."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from minipaged.engine.llm import StepSnapshot
from minipaged.kv.allocator import BlockPool
from minipaged.kv.block_table import BlockTable
from minipaged.kv.contiguous import ContiguousKVCache, FirstFitArena
from minipaged.sim import simulate_contiguous_vs_paged, synthetic_trace
from minipaged.viz.memory import draw_fragmentation, draw_memory_map, draw_waste
from minipaged.viz.pool import draw_block_tables, draw_pool, owners_from_tables
from minipaged.viz.style import SHARED_EDGE, save_figure


def patches(fig: Figure, gid: str) -> list:
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def titles(fig: Figure) -> str:
    return " ".join(ax.get_title(loc="left") for ax in fig.axes)


@pytest.fixture
def arena() -> FirstFitArena:
    """Reservations a:[0,10) b:[10,30) c:[40,45), holes [30,40) and [45,60)."""
    arena = FirstFitArena(60)
    for owner, size in (("a", 10), ("b", 20), ("x", 10), ("c", 5)):
        arena.reserve(owner, size)
    arena.free("x")
    return arena


@pytest.fixture
def seed_example() -> tuple[BlockPool, dict[str, BlockTable]]:
    """Block size 16: A = [7, 3] with 24 tokens, B shares 7, table [7, 9], 20 tokens."""
    pool = BlockPool(12)
    pool.allocate(12)
    for block_id in [7, 3, 9, 0, 1, 2, 4, 5, 6, 8, 10, 11]:
        pool.free([block_id])
    a = BlockTable(16)
    a.append_tokens(24, pool)
    pool.share(7)
    b = BlockTable(16)
    b.add_blocks([7], 16)
    b.append_tokens(4, pool)
    assert (a.block_ids, b.block_ids) == ([7, 3], [7, 9])
    return pool, {"A": a, "B": b}


# ---- memory (stage 0) --------------------------------------------------------------------------


def test_memory_map_from_arena(arena):
    fig = draw_memory_map(arena, used={"a": 10, "b": 5}, label_min_frac=0.0)
    assert isinstance(fig, Figure)
    assert len(patches(fig, "used")) == 2  # a (full) and b; c holds no token
    assert len(patches(fig, "empty")) == 2  # b and c have empty reserved slots; a is full
    assert len(patches(fig, "hole")) == len(arena.holes()) == 2
    assert {"a", "b", "c"} <= set(texts(fig))
    assert "15/35 reserved slots hold tokens" in titles(fig) and "25 free in 2 holes (largest 15)" in titles(fig)


def test_memory_map_from_cache_and_plain_dict():
    cache = ContiguousKVCache(num_layers=1, num_kv_heads=1, head_dim=2, max_seq_len=8, num_slots=20)
    cache.add_sequence("s0")
    cache.add_sequence("s1", reserve=4)
    cache.write(0, "s0", 0, torch.zeros(3, 1, 2), torch.zeros(3, 1, 2))
    fig = draw_memory_map(cache, label_min_frac=0.0)
    assert len(patches(fig, "used")) == 1 and len(patches(fig, "empty")) == 2 and len(patches(fig, "hole")) == 1
    fig = draw_memory_map({0: (5, 5)}, num_slots=20, used={0: 5})
    assert len(patches(fig, "used")) == 1 and len(patches(fig, "empty")) == 0 and len(patches(fig, "hole")) == 2
    with pytest.raises(ValueError):
        draw_memory_map({})


def test_waste_bars():
    fig = draw_waste({"a": 64, "b": 64, "c": 32}, {"a": 64, "b": 16, "c": 8})
    assert len(patches(fig, "used")) == 3 and len(patches(fig, "empty")) == 2
    assert "88/160 slots hold tokens: 45.0% wasted" in titles(fig)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["c", "b", "a"]


def test_fragmentation_plot():
    trace = synthetic_trace(12, seed=0, mean_prompt=24, mean_output=16, max_len=64, arrival_rate=0.5)
    result = simulate_contiguous_vs_paged(trace, num_slots=256, block_size=16, max_seq_len=64, reserve="exact")
    fig = draw_fragmentation(result, num_slots=256)
    top, middle, bottom = fig.axes
    assert len(top.lines) == 4 and len(middle.lines) == 2 and len(bottom.lines) == 2
    assert [t.get_text() for t in bottom.get_legend().get_texts()] == ["contiguous", "paged"]
    assert list(bottom.lines[1].get_ydata()) == result["paged"]["admitted"]
    # Any labels work, e.g. two contiguous runs side by side.
    fig = draw_fragmentation({"time": result["time"], "run 1": result["contiguous"], "run 2": result["paged"]})
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["run 1", "run 2"]


# ---- pool (stage 1) ----------------------------------------------------------------------------


def test_pool_grid_from_pool(seed_example):
    pool, tables = seed_example
    fig = draw_pool(pool, owners_from_tables(tables), ncols=6)
    blocks = patches(fig, "block")
    assert len(blocks) == 12
    shared = [p for p in blocks if p.get_linewidth() > 2]
    assert len(shared) == 1 and matplotlib.colors.same_color(shared[0].get_edgecolor(), SHARED_EDGE)
    labels = texts(fig)
    assert "×2" in labels and "A,B" in labels and "B" in labels
    assert "q0" in labels and "q8" in labels and "q9" not in labels  # 9 free blocks, in queue order
    assert "12 blocks: 3 in use, 9 free" in titles(fig)


def test_pool_grid_from_plain_data_and_snapshot():
    fig = draw_pool([0, 1, 2, 0], owners={1: "x", 2: ["x", "y"]})
    assert len(patches(fig, "block")) == 4 and "×2" in texts(fig) and "x,y" in texts(fig)
    assert "q0" not in texts(fig)  # free order unknown
    fig = draw_pool(5)
    assert len(patches(fig, "block")) == 5 and "5 blocks: 0 in use, 5 free" in titles(fig)
    snap = StepSnapshot(step=3, scheduled=[], preempted=[], finished=[], waiting=[], running=[0, 1],
                        block_tables={0: [0, 2], 1: [0]}, num_tokens={0: 20, 1: 16},
                        ref_cnt=[2, 0, 1, 0], cached=[True, False, False, True])
    fig = draw_pool(snap)
    assert len(patches(fig, "block")) == 4
    assert "0,1" in texts(fig)  # owners taken from the snapshot's block tables
    assert sum(p.get_hatch() is not None for p in patches(fig, "block")) == 2  # cached blocks
    with pytest.raises(ValueError):
        draw_pool([])


# ---- block tables (stage 2) --------------------------------------------------------------------


def test_block_tables_seed_example(seed_example):
    pool, tables = seed_example
    fig = draw_block_tables(tables, block_size=16, num_blocks=12, ref_cnt=[b.ref_cnt for b in pool.blocks])
    assert len(patches(fig, "logical")) == 4 and len(patches(fig, "table")) == 4
    assert len(patches(fig, "physical")) == 12
    assert len(patches(fig, "arrow")) == 4 and all(isinstance(p, FancyArrowPatch) for p in patches(fig, "arrow"))
    slots = patches(fig, "slot")
    assert len(slots) == 4 * 16 + 3 * 16  # every slot of every logical block and of the 3 used physical blocks
    assert sum(not matplotlib.colors.same_color(p.get_facecolor(), "white") for p in slots) == (24 + 20) + (16 + 8 + 4)
    shared = [p for p in patches(fig, "physical") if p.get_linewidth() > 2]
    assert len(shared) == 1
    labels = texts(fig)
    assert labels.count("7") >= 3  # two table cells and the physical block's id
    assert {"A #0", "A #1", "B #0", "B #1", "logical blocks", "block table", "physical blocks"} <= set(labels)


def test_block_tables_plain_data():
    # (ids, num_tokens) pairs, and id lists with num_tokens as in StepSnapshot.
    fig = draw_block_tables({"s": ([2, 0], 20), "t": ([], 0)}, block_size=16, num_blocks=4)
    assert len(patches(fig, "logical")) == 2 and len(patches(fig, "arrow")) == 2
    assert "t: no blocks yet" in texts(fig)
    fig = draw_block_tables({0: [3], 1: [1, 2]}, block_size=4, num_blocks=40, num_tokens={0: 2, 1: 5})
    assert len(patches(fig, "physical")) == 40 and len(patches(fig, "arrow")) == 3
    with pytest.raises(ValueError, match="do not fit"):
        draw_block_tables({"s": ([1], 20)}, block_size=16, num_blocks=4)
    with pytest.raises(ValueError, match="outside the pool"):
        draw_block_tables({"s": ([9], 3)}, block_size=16, num_blocks=4)


# ---- every figure saves ------------------------------------------------------------------------


def all_figures(seed_example) -> dict[str, Figure]:
    pool, tables = seed_example
    arena = FirstFitArena(30)
    arena.reserve("a", 10)
    trace = synthetic_trace(6, seed=1, mean_prompt=16, mean_output=8, max_len=48)
    result = simulate_contiguous_vs_paged(trace, num_slots=128, block_size=16, max_seq_len=48)
    return {
        "memory_map": draw_memory_map(arena, used={"a": 4}),
        "waste": draw_waste({"a": 10}, {"a": 4}),
        "fragmentation": draw_fragmentation(result, num_slots=128),
        "pool": draw_pool(pool, owners_from_tables(tables)),
        "block_tables": draw_block_tables(tables, 16, 12),
    }


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_save_figures(seed_example, tmp_path, suffix):
    import matplotlib.pyplot as plt

    for name, fig in all_figures(seed_example).items():
        path = save_figure(fig, tmp_path / "out" / f"{name}.{suffix}")
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") if suffix == "png" else b"<svg" in data[:2000], name
    assert plt.get_fignums() == []  # render functions never touch pyplot's global figures
