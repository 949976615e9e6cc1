"""Stage 3 pictures (minipaged.viz.slots): where each new token's K/V lands in the pool."""

from __future__ import annotations

import random

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from minipaged.kv.block_pool import BlockPool
from minipaged.kv.block_table import BlockTable
from minipaged.kv.slot_mapping import PAD_SLOT, build_slot_mapping
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


@pytest.mark.slow
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
    assert texts.count("slot -1: skipped") == 1  # one label for the run of padding, not one per token
    assert "A0" in texts and "C5" in texts and "block 7" in texts
    assert ax.get_title() == "prefill"
    _saves(fig, tmp_path, "slot_mapping")


def test_slot_mapping_decode_shows_filled_slots(batch):
    pool, tables = batch
    starts = [t.num_tokens for t in tables]
    for t in tables:
        t.append_tokens(1, pool)
    slots = build_slot_mapping([t.block_ids for t in tables], starts, [s + 1 for s in starts], BLOCK_SIZE).tolist()
    filled = {b * BLOCK_SIZE + o: i for i, t in enumerate(tables) for b in t.block_ids[:1] for o in range(2)}
    fig = draw_slot_mapping(
        slots, [0, 1, 2], BLOCK_SIZE, NUM_BLOCKS, token_pos=starts, seq_names=["x", "y", "z"], filled=filled
    )
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


@pytest.mark.slow
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
