"""Animations of real engine runs: the events each frame claims are in the snapshots, each frame is a
picture of its snapshot alone, and the files matplotlib's FuncAnimation writes play.

The scenarios run the embedded model for ~20-30 steps (fast); the tests draw a few frames each.
"""

from __future__ import annotations

import base64
import io
import re

import pytest
from matplotlib.animation import FuncAnimation
from PIL import Image

from minipaged.__main__ import main
from minipaged.viz import animate
from minipaged.viz.step_events import step_events

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The movies are engine runs drawn frame by frame, and most tests here render one.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prefix_movie():
    return animate.prefix_frames()


@pytest.fixture(scope="module")
def engine_movie():
    return animate.engine_frames()


def _pairs(movie):
    """(snapshot before, frame) for every frame after the first."""
    return [(movie.frames[k - 1].snapshot, movie.frames[k]) for k in range(1, len(movie.frames))]


def test_prefix_run_shares_blocks_and_hits_the_cache(prefix_movie):
    snaps = [f.snapshot for f in prefix_movie.frames]
    assert max(max(s.ref_cnt) for s in snaps) >= 4  # the preamble's blocks: A, B, C and C's fork
    hit_frames = [f for f in prefix_movie.frames if f.events.hits]
    assert len(hit_frames) >= 3  # B, C and E find the preamble's 4 blocks in the cache
    for f in hit_frames:
        for seq, blocks in f.events.hits.items():
            work = next(d for d in f.snapshot.scheduled if d["seq_id"] == seq)
            assert work["kind"] == "prefill" and f.snapshot.block_tables[seq][: len(blocks)] == blocks
            assert all(f.snapshot.cached[b] for b in blocks)
    assert prefix_movie.frames[-1].totals["prefix_hit_tokens"] == 3 * 4 * prefix_movie.block_size


def test_prefix_run_forks_then_copies_on_write(prefix_movie):
    forks = [(f, p, c) for f in prefix_movie.frames for p, c in f.events.forked]
    assert len(forks) == 1
    frame, parent, child = forks[0]
    tables = frame.snapshot.block_tables
    assert tables[parent] == tables[child] and all(frame.snapshot.ref_cnt[b] >= 2 for b in tables[child])
    cows = [(prev, f, e) for prev, f in _pairs(prefix_movie) for e in f.events.cow]
    assert len(cows) == 1
    prev, frame, (seq, old, new) = cows[0]
    i = prev.block_tables[seq].index(old)
    assert prev.ref_cnt[old] == 2 and frame.snapshot.block_tables[seq][i] == new != old
    assert frame.snapshot.ref_cnt[old] == 1 and frame.snapshot.ref_cnt[new] == 1  # the sibling keeps the old block
    assert prev.ref_cnt[new] == 0
    assert "copy-on-write" in frame.caption and f"block {old}" in frame.caption and f"block {new}" in frame.caption


def test_prefix_run_evicts_the_least_recently_freed_cached_block(prefix_movie):
    evictions = [(prev, f, b) for prev, f in _pairs(prefix_movie) for b in f.events.evicted]
    assert evictions
    for prev, frame, b in evictions:
        assert prev.cached[b] and prev.ref_cnt[b] == 0  # a cached block that nobody used ...
        assert any(b in t for t in frame.snapshot.block_tables.values())  # ... handed out again
        assert "evicted" in frame.caption and str(b) in frame.caption
    # E's hit came after the eviction: the preamble, freed last, outlived the blocks evicted before it.
    last_hit = max(k for k, f in enumerate(prefix_movie.frames) if f.events.hits)
    first_eviction = min(k for k, f in enumerate(prefix_movie.frames) if f.events.evicted)
    assert last_hit > first_eviction and prefix_movie.frames[last_hit].events.revived


def test_engine_run_chunks_prefill_grows_tables_and_preempts(engine_movie):
    budget = engine_movie.token_budget
    assert all(sum(d["num_tokens"] for d in f.snapshot.scheduled) <= budget for f in engine_movie.frames)
    chunked = [f for f in engine_movie.frames if "chunked prefill" in f.caption]
    assert chunked and all(any(d["kind"] == "prefill" for d in f.snapshot.scheduled) for f in chunked)
    assert any(f.events.grown for prev, f in _pairs(engine_movie) if not f.events.admitted)
    preempting = [(prev, f) for prev, f in _pairs(engine_movie) if f.events.preempted]
    assert preempting
    for prev, frame in preempting:
        for seq in frame.events.preempted:
            assert seq in prev.block_tables and seq not in frame.snapshot.block_tables
            assert frame.snapshot.waiting[0] == seq  # back at the front of the queue
            assert engine_movie.names[seq] in frame.caption
    resumed = {s for f in engine_movie.frames for s in f.events.resumed}
    assert resumed == {s for _, f in preempting for s in f.events.preempted}
    assert engine_movie.frames[-1].totals["preemptions"] == len(preempting)
    assert not engine_movie.frames[-1].snapshot.block_tables and engine_movie.frames[-1].events.finished


def test_no_two_live_sequences_share_a_colour(prefix_movie, engine_movie):
    for movie in (prefix_movie, engine_movie):
        for f in movie.frames:
            live = set(f.snapshot.running) | set(f.snapshot.waiting)
            inks = [movie.inks[s] for s in live]
            assert len(set(inks)) == len(inks)


def test_captions_name_the_step(engine_movie):
    for f in engine_movie.frames:
        assert f.caption.startswith(f"step {f.snapshot.step}: ")


def test_events_from_a_hand_made_pair_of_snapshots():
    """A fork's child shares its parent's table; a replaced entry is a copy; a reused cached block an eviction."""

    class Snap:
        def __init__(self, **kw):
            self.__dict__.update(
                dict(
                    step=1,
                    scheduled=[],
                    preempted=[],
                    finished=[],
                    waiting=[],
                    running=[],
                    block_tables={},
                    num_tokens={},
                    ref_cnt=[0] * 6,
                    cached=[False] * 6,
                )
                | kw
            )

    prev = Snap(
        running=[0, 1],
        block_tables={0: [0, 1], 1: [0, 1]},
        ref_cnt=[2, 2, 0, 0, 0, 0],
        cached=[True, False, False, True, False, False],
    )
    work = [dict(seq_id=0, request_id=0, kind="decode", num_tokens=1, num_computed_tokens=12)]
    snap = Snap(
        step=2,
        scheduled=work,
        running=[0, 1],
        block_tables={0: [0, 3], 1: [0, 1]},
        ref_cnt=[2, 1, 0, 1, 0, 0],
        cached=[True, False, False, False, False, False],
    )
    ev = step_events(prev, snap, block_size=8)
    assert ev.cow == [(0, 1, 3)] and ev.evicted == [3] and not ev.forked and not ev.freed
    movie = animate.build_frames([prev, snap], block_size=8, num_blocks=6)
    assert "copy-on-write" in movie.frames[1].caption and "block 3" in movie.frames[1].caption


def test_a_frame_is_a_picture_of_its_snapshot_alone(prefix_movie):
    k = next(i for i, f in enumerate(prefix_movie.frames) if f.events.cow)
    fig = animate.draw_frame(prefix_movie, 0)
    animate.draw_frame(prefix_movie, k, fig)  # the same figure, redrawn: nothing of frame 0 stays
    assert animate.frame_png(prefix_movie, k, fig) == animate.frame_png(prefix_movie, k)
    frame, texts = prefix_movie.frames[k], [t.get_text() for ax in fig.axes for t in ax.texts]
    assert frame.caption in [" ".join(t.split()) for t in texts]  # the caption, wrapped
    _, old, new = frame.events.cow[0]
    assert f"copy\nof {old}" in texts  # the copy is tagged in the pool
    assert f"copies on write: {frame.totals['cow_copies']}" in fig.axes[1].texts[0].get_text()
    assert fig.get_suptitle().endswith(f"(frame {k + 1} of {len(prefix_movie.frames)})")


def test_animation_is_a_func_animation_over_the_frames(engine_movie):
    anim = animate.animation(engine_movie.head(3), fps=2)
    assert isinstance(anim, FuncAnimation) and anim._interval == 500
    assert list(anim.new_frame_seq()) == [0, 1, 2] and len(embedded_pngs(anim.to_jshtml())) == 3
    with pytest.raises(ValueError, match="no frames"):
        animate.animation(engine_movie.head(0))


def test_cli_writes_a_gif(tmp_path, capsys):
    out = tmp_path / "prefix.gif"
    main(["animate", "prefix", "--out", str(out), "--max-frames", "3"])
    assert "3 frames" in capsys.readouterr().out
    with Image.open(out) as im:
        assert im.format == "GIF" and im.n_frames == 3 and im.size == (animate.WIDTH, animate.HEIGHT)
        pictures = set()
        for i in range(im.n_frames):
            im.seek(i)
            pictures.add(im.convert("RGB").tobytes())
    assert len(pictures) == 3


def embedded_pngs(page: str) -> list[bytes]:
    """The frames to_jshtml embeds: ``frames[k] = "data:image/png;base64,..."`` (lines continued with a backslash)."""
    found = re.findall(r'frames\[\d+\] = "data:image/png;base64,([A-Za-z0-9+/=\\\n]+)"', page)
    return [base64.b64decode(f.replace("\\\n", "")) for f in found]


def test_cli_writes_a_self_contained_html_page(tmp_path):
    out = tmp_path / "engine.html"
    main(["animate", "engine", "--out", str(out), "--max-frames", "2", "--fps", "2", "--dpi", "50"])
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and 'class="animation"' in page  # to_jshtml's player
    assert re.search(r"new Animation\(frames, img_id, slider_id, 500(\.0)?,", page)  # 2 frames per second
    assert not re.search(r"https?://", page)  # nothing fetched from elsewhere: it plays offline
    assert "<script src" not in page and "<link" not in page and ".fa-play::before" in page
    pngs = embedded_pngs(page)
    assert len(pngs) == 2 and len(set(pngs)) == 2 and all(p.startswith(PNG_MAGIC) for p in pngs)
    assert {Image.open(io.BytesIO(p)).size for p in pngs} == {(animate.WIDTH // 2, animate.HEIGHT // 2)}
    assert len(re.findall(r"<li>step \d+: ", page)) == 2  # the captions, as text


def test_render_rejects_an_unknown_format(prefix_movie, tmp_path):
    with pytest.raises(ValueError, match=r"\.gif or \.html"):
        animate.render(prefix_movie, tmp_path / "movie.mp4")


def test_player_shows_the_frame_the_slider_picks(prefix_movie):
    box = animate.player(prefix_movie.head(3))
    (play, slider), image = box.children[0].children, box.children[1]
    first = bytes(image.value)
    assert first.startswith(PNG_MAGIC) and slider.max == play.max == 2
    slider.value = 1
    assert bytes(image.value) == animate.frame_png(prefix_movie.head(3), 1) != first


def test_jshtml_is_a_player_for_a_notebook_output(engine_movie):
    page = animate.jshtml(engine_movie.head(2))  # IPython.display.HTML(page) plays without a kernel
    assert 'class="animation"' in page and not re.search(r"https?://", page)
    assert len(embedded_pngs(page)) == 2
