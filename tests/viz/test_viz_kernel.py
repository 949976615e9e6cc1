"""Stage 4 pictures (minipaged.viz.kernel): each render function returns a Figure with the
artists its docstring promises for a small state, and saves to PNG and SVG. The numbers they
draw come from minipaged.kernels.tiled (tests/kernels/test_tiled.py)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, Rectangle

from minipaged.kernels.tiled import online_softmax_trace
from minipaged.viz.kernel import draw_launch_grid, draw_online_softmax, draw_program_reads
from minipaged.viz.style import save_figure


def _patches(fig: Figure, gid: str) -> list[Rectangle]:
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def _save_both(fig: Figure, tmp_path) -> None:
    for name in ("x.png", "x.svg"):
        path = save_figure(fig, tmp_path / name)
        assert path.exists() and path.stat().st_size > 0


@pytest.mark.slow
def test_launch_grid_one_box_per_program(tmp_path):
    # 3 sequences x 2 KV heads x 3 query tiles of 4 tokens; q_lens 5, 12, 1 leave 3 + 0 + 2 idle tiles per head.
    fig = draw_launch_grid(3, 2, 3, q_lens=[5, 12, 1], block_q=4, group=4)
    assert isinstance(fig, Figure)
    busy, idle = _patches(fig, "program"), _patches(fig, "idle")
    assert len(busy) + len(idle) == 3 * 2 * 3
    assert len(idle) == 2 * (1 + 0 + 2)
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"(0,0,0)", "(2,1,2)", "KV head 1"} <= texts
    assert any("heads 4-7" in t for t in texts)  # the second KV head serves query heads 4..7
    assert any("q 8-11" in t for t in texts)
    _save_both(fig, tmp_path)


def test_launch_grid_without_q_lens_has_no_idle_programs():
    fig = draw_launch_grid(2, 1, 1)
    assert len(_patches(fig, "program")) == 2 and not _patches(fig, "idle")
    with pytest.raises(ValueError):
        draw_launch_grid(2, 1, 1, q_lens=[1])


@pytest.mark.slow
def test_draw_program_reads_artists(tmp_path):
    table, ctx, bs, bn, num_blocks = [6, 2, 9, 0, 4, 99], 18, 4, 8, 10  # entry 99 is past the context
    fig = draw_program_reads(table, ctx, bs, bn, num_blocks=num_blocks)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    left, right = fig.axes
    assert len(left.patches) == 5 * bs  # 5 logical blocks (the last one partly empty)
    assert len([p for p in right.patches if p.get_gid() == "slot"]) == num_blocks * bs
    assert len(_patches(fig, "read")) == 5  # the five physical blocks read, outlined
    arrows = [a for a in fig.artists if isinstance(a, ConnectionPatch)]
    assert len(arrows) == 5
    labels = {t.get_text() for t in fig.axes[1].texts}
    assert "L4  step 2" in labels and "L0  step 0" in labels
    _save_both(fig, tmp_path)


def test_draw_program_reads_kv_end_and_shared_block():
    # Block 3 appears twice in the table (a shared block): one outline, both logical blocks in its label.
    fig = draw_program_reads([3, 1, 3], 12, 4, 4, kv_end=8)
    assert len(_patches(fig, "read")) == 2
    assert len([a for a in fig.artists if isinstance(a, ConnectionPatch)]) == 2  # L2 is past kv_end
    with pytest.raises(ValueError):
        draw_program_reads([0, 1], 8, 4, 4, num_blocks=1)


@pytest.mark.slow
def test_draw_online_softmax_artists(tmp_path):
    scores = np.linspace(-2, 3, 13) * np.cos(np.arange(13))
    fig = draw_online_softmax(scores, 4)
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    ax1, ax2, ax3 = fig.axes
    assert len(_patches(fig, "score")) == 13
    assert len(ax2.patches) == 4  # one bar per tile of 4 (13 keys -> 4 tiles)
    assert len(ax3.patches) == 13
    assert "max |online - full|" in ax3.get_title()
    heights = [p.get_height() for p in ax2.patches]  # the running sum after each tile, as traced
    assert heights == pytest.approx(online_softmax_trace(scores, 4)["l"].tolist())
    _save_both(fig, tmp_path)
