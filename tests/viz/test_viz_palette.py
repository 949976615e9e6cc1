"""minipaged.viz.palette: one colour per series, distinct colours for owners alive at once."""

from __future__ import annotations

from minipaged.viz.palette import (
    CONTIGUOUS_EXACT,
    CONTIGUOUS_MAX,
    PAGED,
    SEQUENCE_COLORS,
    SHARED,
    STATE_COLORS,
    Ink,
    inks_over_time,
    natural_order,
    owner_inks,
    series_color,
    text_color,
)


def test_every_series_has_one_fixed_colour():
    assert series_color("paged") == series_color("paged, 64 blocks") == PAGED
    assert series_color("contiguous, exact") == CONTIGUOUS_EXACT
    assert series_color("contiguous, max_seq_len") == series_color("contiguous") == CONTIGUOUS_MAX
    assert len({PAGED, CONTIGUOUS_MAX, CONTIGUOUS_EXACT, SHARED}) == 4  # no two series share a colour
    assert STATE_COLORS["preempted"] == SHARED and STATE_COLORS["decode"] != STATE_COLORS["prefill"]
    assert SHARED not in SEQUENCE_COLORS  # vermillion means "shared", never a sequence
    assert len(set(SEQUENCE_COLORS)) == len(SEQUENCE_COLORS)


def test_sequences_get_the_same_colours_in_every_figure():
    a = owner_inks(["C", "A", "B"])
    assert [a[k].color for k in "ABC"] == SEQUENCE_COLORS[:3]  # A, B, C: first, second, third colour
    assert owner_inks(["B", "A", "C"]) == a  # whatever order a figure meets them in
    assert natural_order(["seq 10", "seq 2", 3, 1]) == [1, 3, "seq 2", "seq 10"]


def test_owners_alive_together_never_share_a_colour():
    # 5, 17 and 29 all prefer colour 5 (5 % 12): the first keeps it, the others move on.
    inks = owner_inks([29, 5, 17])
    assert inks[5] == Ink(SEQUENCE_COLORS[5])
    assert len({inks[o] for o in (5, 17, 29)}) == 3
    many = owner_inks(range(30))
    assert len(set(many.values())) == 30  # past twelve colours the palette comes round hatched
    assert all(many[o].hatch is None for o in range(12)) and all(many[o].hatch for o in range(12, 30))


def test_hatching_only_when_every_colour_is_taken():
    inks = owner_inks([0, 12, 24])  # all prefer colour 0
    assert [inks[o].hatch for o in (0, 12, 24)] == [None, None, None]


def test_inks_over_time_keep_an_owner_s_colour_and_recycle_only_free_ones():
    frames = [[1], [1, 2], [2, 3], [3, 4], [4]]  # 1 leaves before 3 arrives
    inks = inks_over_time(frames)
    for alive in frames:
        assert len({inks[o] for o in alive}) == len(alive)
    assert inks[3] == inks[1]  # 1's colour was free again when 3 arrived
    assert inks[4] == inks[2]


def test_text_colour_reads_on_its_fill():
    assert text_color("#000000") == "white" and text_color("#FFFFFF") == "black"
    assert text_color(PAGED) == "white" and Ink(SEQUENCE_COLORS[5]).text == "black"  # yellow
