"""Stage 1 and 2 pictures (minipaged.viz.pool): the block pool and block tables."""

from __future__ import annotations

import matplotlib
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from minipaged.kv.block_pool import BlockPool
from minipaged.kv.block_table import BlockTable
from minipaged.viz.palette import SEQUENCE_COLORS, SHARED, Ink
from minipaged.viz.pool import PoolState, draw_block_tables, draw_pool, owners_from_tables
from minipaged.viz.snapshot import StepSnapshot


def patches(fig: Figure, gid: str) -> list:
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def legend(fig: Figure) -> list[str]:
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


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


def test_pool_grid_from_pool(seed_example):
    pool, tables = seed_example
    fig = draw_pool(pool, owners_from_tables(tables), ncols=6)
    outlines, fills = patches(fig, "block"), patches(fig, "used")  # one of each per block, in block order
    assert len(outlines) == len(fills) == 12
    assert [b for b, p in enumerate(outlines) if p.get_linewidth() > 2] == [7]  # the shared block
    assert matplotlib.colors.same_color(outlines[7].get_edgecolor(), SHARED)
    labels = texts(fig)
    assert "×2" in labels and "A,B" in labels and "B" in labels
    assert labels.count("1") == 1  # block 1's id: a ref count of 1 is never written
    assert "q0" in labels and "q8" in labels and "q9" not in labels  # 9 free blocks, in queue order
    assert "12 blocks: 3 in use, 9 free" in fig.axes[0].get_title(loc="left")
    # A, B: the first two sequence colours, as in every other figure of them; shared 7 in A's
    for b, color in ((3, SEQUENCE_COLORS[0]), (9, SEQUENCE_COLORS[1]), (7, SEQUENCE_COLORS[0])):
        assert matplotlib.colors.same_color(fills[b].get_facecolor(), color)


def test_pool_state_constructors():
    state = PoolState([0, 1, 2, 0], owners={1: "x", 2: ["x", "y"]})
    assert state.owners == {1: ["x"], 2: ["x", "y"]} and state.free_order is None
    fig = draw_pool(state)
    assert len(patches(fig, "block")) == 4 and "×2" in texts(fig) and "x,y" in texts(fig)
    assert "q0" not in texts(fig)  # free order unknown
    title = fig.axes[0].get_title(loc="left")
    assert draw_pool([0, 1, 2, 0], owners={1: "x", 2: ["x", "y"]}).axes[0].get_title(loc="left") == title
    fig = draw_pool(PoolState([0] * 5))
    assert len(patches(fig, "block")) == 5 and "5 blocks: 0 in use, 5 free" in fig.axes[0].get_title(loc="left")
    snap = StepSnapshot(
        step=3,
        scheduled=[],
        preempted=[],
        finished=[],
        waiting=[],
        running=[0, 1],
        block_tables={0: [0, 2], 1: [0]},
        num_tokens={0: 20, 1: 16},
        ref_cnt=[2, 0, 1, 0],
        cached=[True, False, False, True],
    )
    state = PoolState.from_snapshot(snap, labels={0: "A", 1: "B"})
    assert state.owners == {0: ["A", "B"], 2: ["A"]} and state.tables == {"A": [0, 2], "B": [0]}
    assert state.shared_blocks() == {0} and state.block_fill(16) == {0: 1.0, 2: 0.25}
    fig = draw_pool(state)
    assert "A,B" in texts(fig)  # owners taken from the snapshot's block tables
    assert sum(p.get_hatch() is not None for p in patches(fig, "used")) == 1  # block 3: free, still cached
    assert "free, cached" in legend(fig)
    with pytest.raises(ValueError):
        draw_pool([])


def test_pool_owners_alive_together_get_different_colours():
    # Requests 5, 17 and 29 would share one colour if it were picked by id alone.
    fig = draw_pool([1, 1, 1, 0], owners={0: 5, 1: 17, 2: 29})
    faces = {matplotlib.colors.to_hex(p.get_facecolor()) for p in patches(fig, "used")[:3]}
    assert len(faces) == 3
    inks = {5: Ink("#123456"), 17: Ink("#654321"), 29: Ink("#ABCDEF", "xx")}  # e.g. from inks_over_time
    fig = draw_pool([1, 1, 1, 0], owners={0: 5, 1: 17, 2: 29}, inks=inks)
    assert matplotlib.colors.to_hex(patches(fig, "used")[2].get_facecolor()) == "#abcdef"
    assert patches(fig, "used")[2].get_hatch() == "xx"
    with pytest.raises(ValueError, match="no colour for owners \\[29\\]"):
        draw_pool([1, 1, 1, 0], owners={0: 5, 1: 17, 2: 29}, inks={5: inks[5], 17: inks[17]})


def test_block_tables_seed_example(seed_example):
    pool, tables = seed_example
    fig = draw_block_tables(tables, block_size=16, num_blocks=12, ref_cnt=[b.ref_cnt for b in pool.blocks])
    assert len(patches(fig, "logical")) == 4 and len(patches(fig, "table")) == 4
    assert len(patches(fig, "physical")) == 12
    assert len(patches(fig, "arrow")) == 4 and all(isinstance(p, FancyArrowPatch) for p in patches(fig, "arrow"))
    # the filled part of each block: physical blocks 3 (8 of 16 slots), 7 (full), 9 (4), then A #0, A #1, B #0, B #1
    filled = [p for p in patches(fig, "used") if not matplotlib.colors.same_color(p.get_facecolor(), "white")]
    assert [p.get_width() for p in filled] == pytest.approx([0.5 * 2.6, 2.6, 0.25 * 2.6] + [4, 2, 4, 1])
    dividers = [c for c in fig.axes[0].collections if len(c.get_segments()) == 15]  # 16 slots: 15 lines between
    assert len(dividers) == 4 + 12
    shared = [p for p in patches(fig, "physical") if p.get_linewidth() > 2]
    assert len(shared) == 1
    labels = texts(fig)
    assert labels.count("7") >= 3  # two table cells and the physical block's id
    assert {"A #0", "A #1", "B #0", "B #1", "logical blocks", "block table", "physical blocks"} <= set(labels)
    assert matplotlib.colors.same_color(filled[3].get_facecolor(), SEQUENCE_COLORS[0])  # A's first block


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
