"""Stage 0 pictures (minipaged.viz.memory): reservations, waste, the contiguous vs paged replay."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure

from minipaged.kv.contiguous import ContiguousKVCache, FirstFitArena
from minipaged.sim import simulate_contiguous_vs_paged, synthetic_trace
from minipaged.viz.memory import draw_fragmentation, draw_memory_map, draw_waste
from minipaged.viz.palette import CONTIGUOUS_EXACT, CONTIGUOUS_MAX, PAGED


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


def test_memory_map_from_arena(arena):
    fig = draw_memory_map(arena, used={"a": 10, "b": 5}, label_min_frac=0.0)
    assert isinstance(fig, Figure)
    assert len(patches(fig, "used")) == 2  # a (full) and b; c holds no token
    assert len(patches(fig, "empty")) == 2  # b and c have empty reserved slots; a is full
    assert len(patches(fig, "hole")) == len(arena.holes()) == 2
    assert {"a", "b", "c"} <= set(texts(fig))
    assert "15/35 reserved slots hold tokens" in titles(fig) and "25 free in 2 holes (largest 15)" in titles(fig)


def test_memory_map_of_a_contiguous_cache():
    cache = ContiguousKVCache(num_layers=1, num_kv_heads=1, head_dim=2, max_seq_len=8, num_slots=20)
    cache.add_sequence("s0")
    cache.add_sequence("s1", reserve=4)
    cache.write(0, "s0", 0, torch.zeros(3, 1, 2), torch.zeros(3, 1, 2))
    fig = draw_memory_map(cache, label_min_frac=0.0)  # its arena, and its num_tokens as the slots used
    assert len(patches(fig, "used")) == 1 and len(patches(fig, "empty")) == 2 and len(patches(fig, "hole")) == 1
    assert [p.get_width() for p in patches(fig, "used")] == [3] and patches(fig, "hole")[0].get_x() == 12
    assert "3/12 reserved slots hold tokens; 8 free in 1 holes" in titles(fig)
    arena = FirstFitArena(20)
    arena.reserve(0, 5)
    fig = draw_memory_map(arena, used={0: 9})  # used is clipped to the reservation
    assert len(patches(fig, "used")) == 1 and len(patches(fig, "empty")) == 0 and len(patches(fig, "hole")) == 1
    with pytest.raises(ValueError, match="no slots"):
        draw_memory_map(arena, num_slots=0)


def test_waste_bars():
    fig = draw_waste({"a": 64, "b": 64, "c": 32}, {"a": 64, "b": 16, "c": 8})
    assert len(patches(fig, "used")) == 3 and len(patches(fig, "empty")) == 2
    assert "88/160 slots hold tokens: 45.0% wasted" in titles(fig)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["c", "b", "a"]
    with pytest.raises(ValueError):
        draw_waste({}, {})


def test_fragmentation_plot_keeps_each_system_s_colour():
    trace = synthetic_trace(12, seed=0, mean_prompt=24, mean_output=16, max_len=64, arrival_rate=0.5)
    result = simulate_contiguous_vs_paged(trace, num_slots=256, block_size=16, max_seq_len=64, reserve="exact")
    assert result["reserve"] == "exact"
    bare = {k: v for k, v in result.items() if k != "reserve"}  # not told how the contiguous run reserved
    fig = draw_fragmentation(bare, num_slots=256)
    top, middle, bottom = fig.axes
    assert len(top.lines) == 4 and len(middle.lines) == 2 and len(bottom.lines) == 2
    assert list(bottom.lines[1].get_ydata()) == result["paged"]["admitted"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:2] == ["contiguous", "paged"] and "dotted: allocated" in legend
    assert matplotlib.colors.same_color(bottom.lines[0].get_color(), CONTIGUOUS_MAX)  # a bare "contiguous"
    assert matplotlib.colors.same_color(bottom.lines[1].get_color(), PAGED)
    # Told how the contiguous run reserved, it takes that series' colour; other labels work too.
    fig = draw_fragmentation(result)
    assert [t.get_text() for t in fig.legends[0].get_texts()][0] == "contiguous, exact"
    assert matplotlib.colors.same_color(fig.axes[2].lines[0].get_color(), CONTIGUOUS_EXACT)
    fig = draw_fragmentation(
        {
            "time": result["time"],
            "contiguous, exact": result["contiguous"],
            "contiguous, max_seq_len": result["contiguous"],
        }
    )
    colors = [line.get_color() for line in fig.axes[2].lines]
    assert matplotlib.colors.same_color(colors[0], CONTIGUOUS_EXACT)
    assert matplotlib.colors.same_color(colors[1], CONTIGUOUS_MAX)
    with pytest.raises(ValueError):
        draw_fragmentation({"time": []})
