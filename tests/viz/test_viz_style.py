"""Every picture fits a 1280 x 800 projector at the widget's 100 dpi, with text of at least 10 pt (14 px),
and saves as PNG and SVG without touching pyplot."""

from __future__ import annotations

import io
from types import SimpleNamespace

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image

from minipaged.kv.contiguous import FirstFitArena
from minipaged.sim import simulate_contiguous_vs_paged, synthetic_trace
from minipaged.viz import figure_png, save_figure
from minipaged.viz.kernel import draw_launch_grid, draw_online_softmax, draw_program_reads
from minipaged.viz.memory import draw_fragmentation, draw_memory_map, draw_waste
from minipaged.viz.pool import draw_block_tables, draw_pool
from minipaged.viz.prefix import draw_cow_steps, draw_savings, draw_shared_pool
from minipaged.viz.scheduler import draw_kv_usage, draw_step, draw_timeline
from minipaged.viz.slots import draw_pool_fill, draw_slot_mapping
from minipaged.viz.style import SMALL, WIDGET_DPI, fit


def snapshot(step: int, tables: dict, num_tokens: dict, ref_cnt: list, **kw) -> SimpleNamespace:
    """A StepSnapshot-like object: what the draw functions read."""
    base = dict(
        step=step,
        scheduled=[],
        preempted=[],
        finished=[],
        waiting=[],
        running=list(tables),
        block_tables=tables,
        num_tokens=num_tokens,
        ref_cnt=ref_cnt,
        cached=[False] * len(ref_cnt),
        num_free_blocks=ref_cnt.count(0),
    )
    return SimpleNamespace(**{**base, **kw})


def figures() -> dict[str, Figure]:
    """One figure from every public draw function, on a state as big as the notebooks draw."""
    arena = FirstFitArena(4096)
    for i in range(7):
        arena.reserve(i, 512)
    trace = synthetic_trace(40, seed=0, mean_prompt=64, mean_output=32, max_len=256, arrival_rate=0.5)
    result = simulate_contiguous_vs_paged(trace, 2048, 16, 256, reserve="exact")
    owners = {b: 5 + b // 3 for b in range(42)}  # 14 requests in a pool of 48
    tables = {i: [3 * i, 3 * i + 1, 3 * i + 2] for i in range(4)}
    snaps = [
        snapshot(
            s,
            tables,
            {i: 40 + s for i in tables},
            [1] * 12 + [0] * 2,
            scheduled=[{"seq_id": i, "request_id": i, "kind": "decode", "num_tokens": 1} for i in tables],
        )
        for s in range(30)
    ]
    stats = [{"tokens_held": 100 + s, "slots_allocated": 120 + s, "num_preemptions": 0} for s in range(30)]
    shared = snapshot(1, {i: [0, 1, 2, 3 + i] for i in range(12)}, {i: 56 for i in range(12)}, [12] * 3 + [1] * 12)
    return {
        "memory_map": draw_memory_map(arena, used={i: 100 for i in range(7)}, title="step 300"),
        "waste": draw_waste({i: 512 for i in range(7)}, {i: 100 for i in range(7)}),
        "fragmentation": draw_fragmentation(result, num_slots=2048, title="the same trace"),
        "pool": draw_pool([1] * 42 + [0] * 6, owners, free_order=list(range(42, 48)), title="step 68"),
        "block_tables": draw_block_tables(
            {"A": [7, 3], "B": [7, 9], "C": [0, 1, 2]}, 16, 12, num_tokens={"A": 24, "B": 20, "C": 40}
        ),
        "slot_mapping": draw_slot_mapping(list(range(14)) + [-1, -1], [0] * 5 + [1] * 3 + [2] * 6 + [-1, -1], 4, 8),
        "pool_fill": draw_pool_fill([("prefill", [[0, 1], [2], [3, 4]], [5, 3, 6])] * 3, 8, 4),
        "launch_grid": draw_launch_grid(3, 2, 3, q_lens=[5, 12, 1], block_q=4, group=4),
        "program_reads": draw_program_reads([6, 2, 9, 0, 4], 20, 4, 16, num_blocks=12),
        "online_softmax": draw_online_softmax([float((i * 7) % 11) - 5 for i in range(20)], 8),
        "step": draw_step(snaps[3], block_size=16),
        "timeline": draw_timeline(snaps),
        "kv_usage": draw_kv_usage(stats, stats, capacity=160, running=([4] * 30, [2] * 30)),
        "shared_pool": draw_shared_pool(shared, block_size=16, hit_rate=0.5, title="12 requests"),
        "cow_steps": draw_cow_steps([shared, shared, shared], block_size=16),
        "savings": draw_savings(list(range(1, 13)), [i / 20 for i in range(12)], [i / 15 for i in range(12)]),
    }


@pytest.fixture(scope="module")
def all_figures() -> dict[str, Figure]:
    return figures()


@pytest.mark.slow
def test_every_figure_fits_a_projector_with_readable_text(all_figures):
    for name, fig in all_figures.items():
        width, height = Image.open(io.BytesIO(figure_png(fig))).size
        assert width <= 1280 and height <= 800, f"{name}: {width} x {height} px at {WIDGET_DPI} dpi"
        fig.canvas.draw()
        small = [
            (t.get_text(), t.get_fontsize())
            for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < SMALL
        ]
        assert not small, f"{name}: text under {SMALL} pt ({SMALL * WIDGET_DPI / 72:.0f} px): {small[:3]}"


def test_fit_keeps_the_aspect_ratio():
    assert fit(10, 4) == (10, 4)
    w, h = fit(25.2, 4)
    assert (w, h) == pytest.approx((12.6, 2.0))
    w, h = fit(6, 15.6)
    assert (w, h) == pytest.approx((3.0, 7.8))


@pytest.mark.parametrize("suffix", ["png", "svg"])
@pytest.mark.slow
def test_save_figures(all_figures, tmp_path, suffix):
    for name in ("memory_map", "pool", "shared_pool"):
        path = save_figure(all_figures[name], tmp_path / "out" / f"{name}.{suffix}")
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") if suffix == "png" else b"<svg" in data[:2000], name
    assert plt.get_fignums() == []  # render functions never touch pyplot's global figures
