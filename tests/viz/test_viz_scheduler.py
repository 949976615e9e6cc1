"""Stage 5 pictures (minipaged.viz.scheduler): one engine step, the run as a timeline, KV memory over time."""

from __future__ import annotations

import matplotlib
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from minipaged import LLM, SamplingParams
from minipaged.viz.palette import CONTIGUOUS_MAX, PAGED
from minipaged.viz.scheduler import (
    STATE_COLORS,
    describe_step,
    draw_kv_usage,
    draw_step,
    draw_timeline,
    during_steps,
    seq_names,
    timeline_states,
)
from minipaged.viz.style import save_figure


def _saves(fig: Figure, tmp_path, name: str) -> None:
    png = save_figure(fig, tmp_path / f"{name}.png", dpi=60)
    svg = save_figure(fig, tmp_path / f"{name}.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in svg.read_text()


def drive(llm: LLM, prompts: list[list[int]]) -> tuple[list, list[dict]]:
    """Every prompt added at once, then steps until done: (snapshots, kv_stats() after each step)."""
    for p in prompts:
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    snaps, stats = [], []
    while llm.has_unfinished_requests():
        snaps.append(llm.step())
        stats.append(llm.kv_stats())
    return snaps, stats


@pytest.fixture(scope="module")
def run():
    """A tiny engine run with preemptions: (snapshots, paged kv_stats, contiguous kv_stats and snapshots)."""
    prompts = [[1 + i] * n for i, n in enumerate((7, 9, 5, 10))]
    kw = dict(
        block_size=4, num_kvcache_blocks=8, max_num_seqs=3, max_model_len=16, attention_backend="torch", device="cpu"
    )
    snaps, paged = drive(LLM(**kw), prompts)
    contig_snaps, contig = drive(LLM(kv_layout="contiguous", **kw), prompts)
    assert any(s.preempted for s in snaps), "the fixture should preempt"
    return snaps, paged, contig, contig_snaps


@pytest.mark.slow
def test_seq_names_and_describe_step(run):
    snaps, *_ = run
    names = seq_names(snaps)
    assert sorted(names.values()) == ["R0", "R1", "R2", "R3"]
    snap = next(s for s in snaps if s.preempted)
    line = describe_step(snap, names)
    assert line.startswith(f"step {snap.step}: scheduled ")
    assert "preempted " + names[snap.preempted[0]] in line
    assert f"free blocks {snap.num_free_blocks}/8" in line


@pytest.mark.slow
def test_draw_step_panels(run, tmp_path):
    snaps, *_ = run
    names = seq_names(snaps)
    snap = next(s for s in snaps if s.preempted)
    fig = draw_step(snap, block_size=4, names=names)
    assert isinstance(fig, Figure) and len(fig.axes) == 4
    ax_queues, ax_sched, ax_tables, ax_pool = fig.axes
    assert "preemption" in fig.get_suptitle()
    # queues: one box per waiting and running sequence; the preempted one is outlined in red
    boxes = [p for p in ax_queues.patches if isinstance(p, Rectangle)]
    assert len(boxes) == len(snap.waiting) + len(snap.running)
    assert any(p.get_linewidth() > 3 for p in boxes)
    running = {matplotlib.colors.to_hex(p.get_facecolor()) for p in boxes[len(snap.waiting) :]}
    assert len(running) == len(snap.running)  # running sequences never share a colour
    sched_text = " ".join(t.get_text() for t in ax_sched.texts)
    for d in snap.scheduled:
        assert f"{names[d['seq_id']]}: {d['kind']}" in sched_text
    assert f"{names[snap.preempted[0]]}: preempted" in sched_text
    # block tables: one outline per block of every live sequence
    outlines = [p for p in ax_tables.patches if p.get_facecolor()[:3] == (1.0, 1.0, 1.0)]
    assert len(outlines) == sum(len(t) for t in snap.block_tables.values())
    # pool: one box per block, labelled with its id
    assert len(ax_pool.patches) == 8
    assert sorted(int(t.get_text()) for t in ax_pool.texts) == list(range(8))
    assert ax_pool.get_title(loc="left") == f"pool: 8 blocks, {snap.num_free_blocks} free"
    _saves(fig, tmp_path, "step")
    # a quiet step draws too, without the preemption banner
    quiet = draw_step(snaps[-1])
    assert "preemption" not in quiet.get_suptitle()


@pytest.mark.slow
def test_timeline_rows_and_states(run, tmp_path):
    snaps, *_ = run
    states, finished = timeline_states(snaps)
    assert len(states) == 4 and len(finished) == 4
    assert {st for per in states.values() for st in per.values()} <= set(STATE_COLORS)
    fig = draw_timeline(snaps)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["R3", "R2", "R1", "R0"]  # bottom to top
    preempted_runs = [p for p in ax.patches if p.get_hatch() == "xx"]
    assert len(preempted_runs) == sum(len(s.preempted) for s in snaps)  # each preemption lasts one step
    (markers,) = ax.lines
    assert len(markers.get_xdata()) == 4
    legend_labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"waiting", "prefill", "decode", "preempted", "finished"} <= set(legend_labels)
    _saves(fig, tmp_path, "timeline")


def test_during_steps_carries_memory_through_the_step_that_frees_it():
    # After step 3 both reservations had finished and freed; step 4 admitted two new ones.
    assert during_steps([32, 32, 0, 32, 0]) == [32, 32, 32, 32, 32]
    # A step that preempted freed its memory before it ran: its own record stands.
    assert during_steps([32, 16, 16], preemptions=[0, 1, 1]) == [32, 16, 16]
    assert during_steps([]) == []


@pytest.mark.slow
def test_kv_usage_lines(run, tmp_path):
    snaps, paged, contig, contig_snaps = run
    fig = draw_kv_usage(paged, contig, capacity=32)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.lines}
    for name in ("paged", "contiguous"):
        assert f"{name}: slots allocated" in lines and f"{name}: slots holding a token" in lines
    assert "budget: 32 slots" in lines
    assert f"paged: done after step {len(paged)}" in lines
    assert matplotlib.colors.same_color(lines["paged: slots allocated"].get_color(), PAGED)
    assert matplotlib.colors.same_color(lines["contiguous: slots allocated"].get_color(), CONTIGUOUS_MAX)
    assert max(lines["paged: slots allocated"].get_ydata()) <= 32
    # The contiguous cache is empty between some steps (all reservations just finished), never during one.
    recorded = [d["slots_allocated"] for d in contig]
    assert 0 in recorded[:-1]
    drawn = list(lines["contiguous: slots allocated"].get_ydata())
    assert min(drawn) > 0 and drawn == during_steps(recorded, [d["num_preemptions"] for d in contig])
    assert fig.legends and ax.get_legend() is None  # the legend sits below the plot, not over the data
    _saves(fig, tmp_path, "kv_usage")


@pytest.mark.slow
def test_kv_usage_running_panel_counts_whole_sequences(run):
    snaps, paged, contig, contig_snaps = run
    running = ([len(s.running) for s in snaps], [len(s.running) for s in contig_snaps])
    fig = draw_kv_usage(paged, contig, running=running)
    ax_kv, ax_run = fig.axes
    assert [line.get_label() for line in ax_run.lines] == ["paged", "contiguous"]
    assert all(float(t).is_integer() for t in ax_run.get_yticks())  # no "2.5 sequences"
    assert min(ax_run.lines[1].get_ydata()) > 0  # a sequence finishing is still running during its last step
