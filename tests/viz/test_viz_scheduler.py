"""Stage 5 pictures (minipaged.viz.scheduler): one engine step, the run as a timeline, KV memory over time."""

from __future__ import annotations

import matplotlib
import pytest
from matplotlib.figure import Figure

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
)
from minipaged.viz.snapshot import step_snapshot
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
        snaps.append(step_snapshot(llm))
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
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    ax_tables, ax_queues, ax_pool = fig.axes
    assert "preemption" in fig.get_suptitle()
    # block tables: one row per sequence of the step, its blocks, then what it did
    rows = [t.get_text() for t in ax_tables.texts]
    for d in snap.scheduled:
        assert names[d["seq_id"]] in rows and any(r.startswith(d["kind"]) for r in rows)
    assert names[snap.preempted[0]] in rows and "preempted: blocks freed" in rows
    cells = [p for p in ax_tables.patches if p.get_gid() == "table_cell"]
    assert len(cells) == sum(len(t) for t in snap.block_tables.values())
    fills = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax_tables.patches if p.get_gid() == "used"}
    assert len(fills) == len(snap.block_tables)  # sequences alive together never share a colour
    queues = ax_queues.texts[0].get_text()
    assert f"running: {' '.join(names[s] for s in snap.running)}" in queues
    assert f"free blocks: {snap.num_free_blocks} of 8" in queues
    # pool: one box per block, labelled with its id
    assert len([p for p in ax_pool.patches if p.get_gid() == "block"]) == 8
    assert {str(b) for b in range(8)} <= {t.get_text() for t in ax_pool.texts}
    assert ax_pool.get_title(loc="left") == f"pool: 8 blocks, {snap.ref_cnt.count(0)} free"
    _saves(fig, tmp_path, "step")
    # a quiet step draws too, without the preemption banner
    quiet = draw_step(snaps[-1])
    assert "preemption" not in quiet.get_suptitle()


@pytest.mark.slow
def test_draw_step_as_an_animation_frame(run):
    snaps, *_ = run
    fig = draw_step(snaps[0])  # drawn again into the same figure: nothing of the first picture stays
    usage = [(s.step, 8 - s.num_free_blocks) for s in snaps]
    draw_step(snaps[1], 4, fig=fig, caption="step 2: hello", tags={0: "new"}, notes=["totals: 0"], usage=usage)
    assert len(fig.axes) == 5 and fig.axes[-1].get_title(loc="left") == "blocks in use"
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "step 2: hello" in texts and "new" in texts and "totals: 0" in fig.axes[1].texts[0].get_text()
    (line,) = fig.axes[-1].lines
    assert list(line.get_xdata()) == [snaps[0].step, snaps[1].step]  # blocks in use up to this step
    assert fig.axes[-1].get_xlim() == (snaps[0].step - 0.5, snaps[-1].step + 0.5)  # the whole run's steps


@pytest.mark.slow
def test_timeline_rows_and_states(run, tmp_path):
    snaps, *_ = run
    fig = draw_timeline(snaps)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["R3", "R2", "R1", "R0"]  # bottom to top
    preempted_runs = [p for p in ax.patches if p.get_hatch() == "xx"]
    assert len(preempted_runs) == sum(len(s.preempted) for s in snaps)  # each preemption lasts one step
    faces = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}
    assert faces <= {matplotlib.colors.to_hex(c) for c in STATE_COLORS.values()}
    (markers,) = ax.lines
    assert len(markers.get_xdata()) == 4  # every request finished, each at the end of its last step
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
