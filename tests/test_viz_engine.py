"""Stage 3 and 5 figures: each render function draws the expected artists for a small real state."""

from __future__ import annotations

import random

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from minipaged import LLM, SamplingParams
from minipaged.kv.allocator import BlockPool
from minipaged.kv.block_table import BlockTable
from minipaged.kv.slot_mapping import PAD_SLOT, build_slot_mapping
from minipaged.viz.scheduler import (
    STATE_COLORS,
    describe_step,
    draw_kv_usage,
    draw_step,
    draw_timeline,
    seq_names,
    timeline_states,
)
from minipaged.viz.slots import draw_pool_fill, draw_slot_mapping
from minipaged.viz.style import save_figure

BLOCK_SIZE, NUM_BLOCKS = 4, 8
PROMPT_LENS = [5, 3, 6]


def _saves(fig: Figure, tmp_path, name: str) -> None:
    png = save_figure(fig, tmp_path / f"{name}.png", dpi=60)
    svg = save_figure(fig, tmp_path / f"{name}.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in svg.read_text()


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text") and callable(a.get_text))]


@pytest.fixture
def batch():
    """Three sequences prefilled in a pool whose free order is shuffled: (pool, tables)."""
    pool = BlockPool(NUM_BLOCKS)
    blocks = pool.allocate(NUM_BLOCKS)
    random.Random(7).shuffle(blocks)
    for b in blocks:
        pool.free([b])
    tables = [BlockTable(BLOCK_SIZE) for _ in PROMPT_LENS]
    for t, n in zip(tables, PROMPT_LENS, strict=True):
        t.append_tokens(n, pool)
    return pool, tables


def test_slot_mapping_arrows_skip_padding(batch, tmp_path):
    _, tables = batch
    slots = build_slot_mapping([t.block_ids for t in tables], [0, 0, 0], PROMPT_LENS, BLOCK_SIZE).tolist()
    slots += [PAD_SLOT, PAD_SLOT]
    token_seq = [i for i, n in enumerate(PROMPT_LENS) for _ in range(n)] + [-1, -1]
    token_pos = [p for n in PROMPT_LENS for p in range(n)] + [0, 0]
    fig = draw_slot_mapping(slots, token_seq, BLOCK_SIZE, NUM_BLOCKS, token_pos=token_pos, title="prefill")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(arrows) == sum(PROMPT_LENS)  # one per real token, none for padding
    rects = [p for p in ax.patches if isinstance(p, Rectangle)]
    # tokens (padding included) + slots + one outline per block
    assert len(rects) == len(slots) + NUM_BLOCKS * BLOCK_SIZE + NUM_BLOCKS
    texts = _texts(fig)
    assert texts.count("pad") == 2 and "A0" in texts and "C5" in texts and "block 7" in texts
    assert ax.get_title() == "prefill"
    _saves(fig, tmp_path, "slot_mapping")


def test_slot_mapping_decode_shows_filled_slots(batch):
    pool, tables = batch
    starts = [t.num_tokens for t in tables]
    for t in tables:
        t.append_tokens(1, pool)
    slots = build_slot_mapping([t.block_ids for t in tables], starts, [s + 1 for s in starts], BLOCK_SIZE).tolist()
    filled = {b * BLOCK_SIZE + o: i for i, t in enumerate(tables) for b in t.block_ids[:1] for o in range(2)}
    fig = draw_slot_mapping(slots, [0, 1, 2], BLOCK_SIZE, NUM_BLOCKS, token_pos=starts, seq_names=["x", "y", "z"],
                            filled=filled)
    (ax,) = fig.axes
    assert len([p for p in ax.patches if isinstance(p, FancyArrowPatch)]) == 3
    assert "x5" in _texts(fig) and "padding (slot -1)" not in _texts(fig)
    pale = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_alpha() == 0.35]
    assert len(pale) == len(set(filled) - set(slots))


def test_slot_mapping_rejects_bad_input():
    with pytest.raises(ValueError, match="token_seq"):
        draw_slot_mapping([0, 1], [0], BLOCK_SIZE, NUM_BLOCKS)
    with pytest.raises(ValueError, match="slot ids"):
        draw_slot_mapping([NUM_BLOCKS * BLOCK_SIZE], [0], BLOCK_SIZE, NUM_BLOCKS)


def test_pool_fill_outlines_new_tokens(batch, tmp_path):
    pool, tables = batch
    frames = [("prefill", [list(t.block_ids) for t in tables], list(PROMPT_LENS))]
    for step in (1, 2):
        for t in tables:
            t.append_tokens(1, pool)
        frames.append((f"decode {step}", [list(t.block_ids) for t in tables], [t.num_tokens for t in tables]))
    fig = draw_pool_fill(frames, NUM_BLOCKS, BLOCK_SIZE, seq_names=["A", "B", "C"])
    assert len(fig.axes) == 3
    new_tokens = [sum(PROMPT_LENS), 3, 3]
    for ax, (label, _, _), new in zip(fig.axes, frames, new_tokens, strict=True):
        rects = [p for p in ax.patches if isinstance(p, Rectangle)]
        outlines = [r for r in rects if not r.get_fill()]
        assert len(outlines) == new
        assert len(rects) - len(outlines) == NUM_BLOCKS * BLOCK_SIZE
        assert ax.get_title() == label
    _saves(fig, tmp_path, "pool_fill")
    with pytest.raises(ValueError, match="at least one frame"):
        draw_pool_fill([], NUM_BLOCKS, BLOCK_SIZE)
    with pytest.raises(ValueError, match="holds 9 tokens"):
        draw_pool_fill([("bad", [[0, 1]], [9])], NUM_BLOCKS, BLOCK_SIZE)


@pytest.fixture(scope="module")
def run():
    """A tiny engine run with preemptions: (snapshots, paged kv_stats, contiguous kv_stats, num_blocks)."""
    prompts = [[1 + i] * n for i, n in enumerate((7, 9, 5, 10))]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    kw = dict(block_size=4, num_kvcache_blocks=8, max_num_seqs=3, max_model_len=16, attention_backend="torch",
              device="cpu")
    llm = LLM(**kw)
    for p in prompts:
        llm.add_request(p, params)
    snaps, paged = [], []
    while llm.has_unfinished_requests():
        snaps.append(llm.step())
        paged.append(llm.kv_stats())
    contiguous = LLM(kv_cache="contiguous", **kw)
    for p in prompts:
        contiguous.add_request(p, params)
    contig = []
    while contiguous.has_unfinished_requests():
        contiguous.step()
        contig.append(contiguous.kv_stats())
    assert any(s.preempted for s in snaps), "the fixture should preempt"
    return snaps, paged, contig, 8


def test_seq_names_and_describe_step(run):
    snaps, *_ = run
    names = seq_names(snaps)
    assert sorted(names.values()) == ["R0", "R1", "R2", "R3"]
    snap = next(s for s in snaps if s.preempted)
    line = describe_step(snap, names)
    assert line.startswith(f"step {snap.step}: scheduled ")
    assert "preempted " + names[snap.preempted[0]] in line
    assert f"free blocks {snap.num_free_blocks}/8" in line


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


def test_kv_usage_lines(run, tmp_path):
    _, paged, contig, num_blocks = run
    fig = draw_kv_usage(paged, contig, capacity=num_blocks * 4)
    (ax,) = fig.axes
    labels = [line.get_label() for line in ax.lines]
    for name in ("paged", "contiguous"):
        assert f"{name}: slots allocated" in labels and f"{name}: slots holding a token" in labels
    assert "budget: 32 slots" in labels
    allocated = next(line for line in ax.lines if line.get_label() == "paged: slots allocated")
    assert max(allocated.get_ydata()) <= num_blocks * 4
    _saves(fig, tmp_path, "kv_usage")
    # (tokens_held, slots_allocated) pairs work as well as kv_stats() dicts
    pairs = draw_kv_usage([(1, 4), (2, 4)], [(1, 16), (2, 16)])
    assert len([line for line in pairs.axes[0].lines if "slots" in line.get_label()]) == 4
