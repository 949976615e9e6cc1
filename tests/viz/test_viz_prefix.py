"""Stage 6 pictures: each render function draws the expected artists for a small real state and saves."""

from __future__ import annotations

import pytest
from matplotlib.colors import same_color
from matplotlib.figure import Figure

from minipaged import LLM, SamplingParams
from minipaged.viz.palette import SHARED
from minipaged.viz.pool import PoolState
from minipaged.viz.prefix import (
    as_state,
    copies_between,
    draw_cow_steps,
    draw_savings,
    draw_shared_pool,
    sharing_summary,
)
from minipaged.viz.snapshot import step_snapshot
from minipaged.viz.style import save_figure

BLOCK = 4
PREFIX = [5, 6, 7, 8, 9, 10, 11, 12]  # two full blocks of 4, shared by every request below
TAILS = [[20, 21, 22], [30, 31], [40, 41, 42, 43, 44]]  # first tokens differ: nothing else is shared


def patches(fig: Figure, gid: str) -> list:
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def ref_cnts(fig: Figure) -> list[str]:
    """The ``×n`` written on shared blocks of the pool (tables show block ids only)."""
    return [t.get_text() for ax in fig.axes for t in ax.texts if t.get_text().startswith("×")]


def shared_outlines(fig: Figure, gid: str) -> list:
    return [p for p in patches(fig, gid) if p.get_linewidth() > 2 and same_color(p.get_edgecolor(), SHARED)]


def legend_labels(fig: Figure) -> list[str]:
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def assert_saves(fig: Figure, folder, name: str) -> None:
    png = save_figure(fig, folder / f"{name}.png")
    svg = save_figure(fig, folder / f"{name}.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert b"<svg" in svg.read_bytes()[:2000]


@pytest.fixture(scope="module")
def shared_snapshot(tiny_model_dir):
    """Request 0 computes the prefix, requests 1 and 2 arrive a step later and hit its two blocks."""
    llm = LLM(tiny_model_dir, block_size=BLOCK, num_kvcache_blocks=16, max_model_len=64, enable_prefix_caching=True)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm.add_request(PREFIX + TAILS[0], sp)
    llm.step()
    for tail in TAILS[1:]:
        llm.add_request(PREFIX + tail, sp)
    snap = step_snapshot(llm)
    assert llm.kv_stats()["prefix_hit_tokens"] == 2 * len(PREFIX)
    return snap


@pytest.fixture(scope="module")
def cow_frames(tiny_model_dir):
    """n=3 samples of a 6-token prompt: they share its partial second block, then copy it."""
    llm = LLM(tiny_model_dir, block_size=BLOCK, num_kvcache_blocks=16, max_model_len=64, enable_prefix_caching=True)
    llm.add_request([1, 2, 3, 4, 5, 6], SamplingParams(temperature=1.0, seed=0, n=3, max_tokens=6, ignore_eos=True))
    frames = [step_snapshot(llm) for _ in range(3)]
    assert llm.kv_stats()["cow_copies"] == 2
    return frames


@pytest.mark.slow
def test_draw_shared_pool_marks_shared_blocks_and_their_ref_cnt(shared_snapshot, tmp_path):
    snap = shared_snapshot
    shared = [b for b in range(len(snap.ref_cnt)) if snap.ref_cnt[b] > 1]
    assert len(shared) == 2 and all(snap.ref_cnt[b] == 3 for b in shared)
    labels = {sid: f"req {k}" for k, sid in enumerate(sorted(snap.block_tables))}
    fig = draw_shared_pool(snap, labels, block_size=BLOCK, hit_rate=0.5, title="three requests")
    assert isinstance(fig, Figure)
    assert len(patches(fig, "block")) == len(snap.ref_cnt)  # a 16-block pool is drawn whole
    assert len(patches(fig, "table_cell")) == sum(len(t) for t in snap.block_tables.values())
    assert ref_cnts(fig) == ["×3", "×3"]
    assert len(shared_outlines(fig, "block")) == 2 and len(shared_outlines(fig, "table_cell")) == 3 * 2
    title = fig.axes[0].get_title(loc="left")
    assert "three requests" in title and "3 sequences" in title and "2 shared blocks" in title
    assert "prefix hit rate 50%" in title
    assert {"req 0", "req 1", "req 2", "shared: ×ref_cnt", "free"} <= set(legend_labels(fig))
    assert_saves(fig, tmp_path, "shared")


def test_draw_shared_pool_from_plain_tuples_counts_sharing_from_tables(tmp_path):
    tables = {"A": [7, 3], "B": [7, 9]}
    fig = draw_shared_pool((tables, {"A": 24, "B": 26}, None, None), block_size=16)
    assert ref_cnts(fig) == ["×2"]
    assert len(patches(fig, "block")) == 10  # blocks 0..9: up to the highest id
    assert "3 blocks in use instead of 4 (25% saved)" in fig.axes[0].get_title(loc="left")
    s = sharing_summary((tables, None), block_size=16)
    assert (s["blocks_in_use"], s["blocks_without_sharing"], s["shared_blocks"], s["tokens_shared"]) == (3, 4, [7], 16)
    with pytest.raises(ValueError):
        draw_shared_pool((tables, None, [1, 1], None))  # ref_cnt shorter than the block ids


def test_a_state_from_tables_counts_each_block_s_users_once():
    st = as_state(({0: [7, 3], 1: [7, 9]}, {0: 24, 1: 26}))
    assert list(st.tables) == ["seq 0", "seq 1"] and st.owners == {7: ["seq 0", "seq 1"], 3: ["seq 0"], 9: ["seq 1"]}
    assert st.ref_cnt == [0, 0, 0, 1, 0, 0, 0, 2, 0, 1]  # no ref_cnt given: counted from the tables
    assert st.shared_blocks() == {7} and st.block_fill(16) == {7: 1.0, 3: 0.5, 9: 10 / 16}
    with_ref = PoolState.from_tables({"A": [1]}, ref_cnt=[3, 2], labels=["a"])
    assert with_ref.shared_blocks() == {0, 1} and with_ref.num_tokens == {"a": -1}  # -1: unknown, drawn full
    with pytest.raises(ValueError, match="distinct"):
        PoolState.from_tables({0: [1], 1: [2]}, labels=["x", "x"])
    assert as_state(st) is st


def test_equal_token_counts_are_written_once(tmp_path):
    tables = {"A": [7, 3], "B": [7, 9]}
    fig = draw_shared_pool((tables, {"A": 24, "B": 24}), block_size=16)
    notes = [t.get_text() for t in fig.axes[0].texts if "tokens" in t.get_text()]
    assert notes == ["24 tokens each"]
    fig = draw_shared_pool((tables, {"A": 24, "B": 20}), block_size=16)
    assert [t.get_text() for t in fig.axes[0].texts if "tokens" in t.get_text()] == ["24 tokens", "20 tokens"]


def test_long_tables_collapse_shared_runs_and_big_pools_are_cut():
    tables = {f"r{i}": list(range(20)) + [20 + i] for i in range(3)}
    ref_cnt = [3] * 20 + [1, 1, 1] + [0] * 200
    fig = draw_shared_pool((tables, {k: 81 for k in tables}, ref_cnt, None), block_size=4)
    assert len(patches(fig, "table_run")) == 3 and len(patches(fig, "table_cell")) == 3
    assert len(patches(fig, "block")) < 60  # up to the last block in use, plus a row
    assert ref_cnts(fig) == ["×3"] * 20


@pytest.mark.slow
def test_draw_cow_steps_draws_one_arrow_per_copy(cow_frames, tmp_path):
    before, after = as_state(cow_frames[0]), as_state(cow_frames[1])
    copies = copies_between(before, after)
    assert len(copies) == 2 and all(old == copies[0][2] for _, _, old, _ in copies)  # both copied the shared tail
    labels = ["sample 0", "sample 1", "sample 2"]
    fig = draw_cow_steps(cow_frames, labels, block_size=BLOCK, titles=["fork", "copy", "later"])
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    assert len(patches(fig, "copy_arrow")) == 2
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["fork", "copy", "later"]
    assert ref_cnts(fig)[:2] == ["×3", "×3"]  # frame 0: both prompt blocks shared by 3 samples
    assert "copy-on-write copy" in legend_labels(fig)
    default = draw_cow_steps(cow_frames[:2], labels, block_size=BLOCK)
    assert "copy-on-write" in default.axes[1].get_title(loc="left")
    assert_saves(fig, tmp_path, "cow")
    with pytest.raises(ValueError):
        draw_cow_steps(cow_frames, labels, titles=["only one"])


@pytest.mark.slow
def test_draw_savings_plots_percentages(tmp_path):
    ns, saved, hits = [1, 2, 4, 8], [0.0, 0.3, 0.45, 0.55], [0.0, 0.4, 0.6, 0.7]
    fig = draw_savings(ns, saved, hits, limit=0.6)
    lines = {line.get_gid(): line for line in fig.axes[0].lines}
    assert set(lines) == {"saved", "hit_rate", "limit"}
    assert list(lines["saved"].get_ydata()) == pytest.approx([0, 30, 45, 55])
    assert list(lines["hit_rate"].get_xdata()) == ns
    assert_saves(fig, tmp_path, "savings")
    assert len(draw_savings(ns, saved).axes[0].lines) == 1
    with pytest.raises(ValueError):
        draw_savings(ns, saved[:2])


def test_render_functions_leave_pyplot_alone(shared_snapshot):
    import matplotlib.pyplot as plt

    n = len(plt.get_fignums())
    draw_shared_pool(shared_snapshot)
    assert len(plt.get_fignums()) == n  # pure: the figure is returned, never registered with pyplot
