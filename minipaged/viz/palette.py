"""Every colour the pictures use, in one place: one colour per series, one per live sequence.

A learner compares figures across notebooks, so a colour keeps its meaning everywhere:

- **series** (:data:`SERIES`): paged memory is always blue, a contiguous cache that reserves
  ``max_seq_len`` always orange, one that reserves exactly prompt + output always purple; free
  blocks light grey, wasted slots mid grey, shared blocks vermillion, cached-but-free blocks
  pale blue;
- **sequences** (:data:`SEQUENCE_COLORS`): the first sequence drawn (``A``, ``seq 0``,
  ``request 0``) is blue, the second orange, the third green, ... The series colours are
  Okabe-Ito's, safe for every common colour-vision deficiency; sequences go on with four of Paul
  Tol's muted colours. Vermillion is left out of the sequence colours: it means *shared*.

Sequences alive at the same time never share a colour (:func:`owner_inks`): an owner that would
land on a colour already taken moves to the next free one, and past the last colour the palette
starts over with a hatch pattern (:class:`Ink`). :func:`inks_over_time` does the same for a
whole run, so that an owner keeps one colour for its whole life, like a block from a free list.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from matplotlib.colors import to_rgb

# Okabe-Ito, in their usual order (black last: text and outlines).
BLUE, ORANGE, GREEN, PURPLE = "#0072B2", "#E69F00", "#009E73", "#CC79A7"
SKY, VERMILLION, YELLOW, BLACK = "#56B4E9", "#D55E00", "#F0E442", "#000000"
PALETTE = [BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION, YELLOW, BLACK]

PAGED = BLUE
CONTIGUOUS_MAX = ORANGE  # a contiguous cache that reserves max_seq_len per sequence
CONTIGUOUS_EXACT = PURPLE  # one that reserves exactly prompt + output (an oracle)
FREE = "#EEEEEE"
WASTE = "#BBBBBB"  # slots reserved or allocated that hold no token
IN_USE = "#9E9E9E"  # a block in use by an owner the caller did not name
SHARED = VERMILLION
SHARED_FILL = "#FBE0CF"  # pale vermillion, under the hatching of a shared block
CACHED = "#D6EAF8"  # a free block that still holds a cached prefix
CACHED_HATCH = ".."
SHARED_HATCH = "//"
EMPTY_HATCH = "///"  # reserved but empty slots
MUTED = "#666666"  # secondary text

SERIES = {
    "paged": PAGED,
    "contiguous, max_seq_len": CONTIGUOUS_MAX,
    "contiguous, exact": CONTIGUOUS_EXACT,
    "free": FREE,
    "waste": WASTE,
    "shared": SHARED,
    "cached": CACHED,
}

# What a sequence is doing in an engine step (stage 5).
STATE_COLORS = {
    "waiting": "#DDDDDD",
    "prefill": ORANGE,
    "decode": BLUE,
    "preempted": VERMILLION,
    "idle": "#9ECAE1",  # running but not scheduled (token budget spent)
}

# Sequences: Okabe-Ito without vermillion (shared) and black, then Paul Tol's muted.
SEQUENCE_COLORS = [
    BLUE,
    ORANGE,
    GREEN,
    PURPLE,
    SKY,
    YELLOW,
    "#332288",
    "#882255",
    "#999933",
    "#44AA99",
    "#CC6677",
    "#A6761D",
]
OVERFLOW_HATCHES = [None, "\\\\", "xx", "++"]  # one per round through SEQUENCE_COLORS


@dataclass(frozen=True)
class Ink:
    """How an owner's blocks are filled: a colour, and a hatch once the colours run out."""

    color: str
    hatch: str | None = None

    @property
    def text(self) -> str:
        """Black or white, whichever reads better on this fill."""
        return text_color(self.color)


def text_color(fill: str) -> str:
    """Black or white text for a fill colour (by its luminance)."""
    r, g, b = to_rgb(fill)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"


def series_color(label: str) -> str:
    """The fixed colour of a memory system named ``label`` (e.g. ``"paged"``, ``"contiguous, exact"``).

    A bare ``"contiguous"`` is the engine's and the replay's default, a ``max_seq_len`` reservation.
    """
    key = label.lower()
    if "paged" in key:
        return PAGED
    if "exact" in key:
        return CONTIGUOUS_EXACT
    return CONTIGUOUS_MAX


def owner_color(k: int) -> str:
    """The colour of the ``k``-th sequence (``A`` = 0, ``B`` = 1, ...)."""
    return SEQUENCE_COLORS[k % len(SEQUENCE_COLORS)]


step_color = owner_color  # the loop steps of a kernel's walk (stage 4) take the same colours in order


def _natural_key(owner: Hashable) -> tuple:
    """Order owners as a reader would: 2 before 10, ``"seq 2"`` before ``"seq 10"``, ints first."""
    if isinstance(owner, int) and not isinstance(owner, bool):
        return (0, owner)
    parts = re.split(r"(\d+)", str(owner))
    return (1, [int(p) if p.isdigit() else p for p in parts])


def natural_order(owners: Iterable[Hashable]) -> list[Hashable]:
    """Distinct owners as a reader would order them: ints first, ``"seq 2"`` before ``"seq 10"``."""
    return sorted(dict.fromkeys(owners), key=_natural_key)


def _ink(slot: int) -> Ink:
    n = len(SEQUENCE_COLORS)
    return Ink(SEQUENCE_COLORS[slot % n], OVERFLOW_HATCHES[(slot // n) % len(OVERFLOW_HATCHES)])


def _preferred(owner: Hashable, rank: int) -> int:
    """An int owner (a request id) prefers its own colour, so it keeps it from figure to figure."""
    if isinstance(owner, int) and not isinstance(owner, bool):
        return owner % len(SEQUENCE_COLORS)
    return rank % len(SEQUENCE_COLORS)


def owner_inks(owners: Iterable[Hashable]) -> dict[Hashable, Ink]:
    """An :class:`Ink` per owner, all different: the owners of one picture are alive at once.

    Owners are taken in natural order (``A``, ``B``, ``C``; ``seq 2`` before ``seq 10``); the
    k-th string owner prefers colour k, an int owner colour ``owner % 12``. A preferred colour
    already taken moves the owner on to the next free one; after twelve owners the colours come
    round again with a hatch. The same owners give the same inks in every figure.
    """
    n = len(SEQUENCE_COLORS)
    taken: set[int] = set()
    out = {}
    for rank, owner in enumerate(natural_order(owners)):
        first = _preferred(owner, rank)
        # the next free colour after the preferred one; a hatched round only when all are taken
        slot = next(
            r * n + (first + i) % n for r in itertools.count() for i in range(n) if r * n + (first + i) % n not in taken
        )
        taken.add(slot)
        out[owner] = _ink(slot)
    return out


def inks_over_time(frames: Sequence[Iterable[Hashable]]) -> dict[Hashable, Ink]:
    """One :class:`Ink` per owner for a whole run, from the owners alive in each frame.

    Like a block pool's free list: an owner takes the first free ink when it first appears and
    gives it back after the last frame it is alive in, so an owner's colour never changes and no
    two owners alive in the same frame share one.
    """
    first: dict[Hashable, int] = {}
    last: dict[Hashable, int] = {}
    for t, alive in enumerate(frames):
        for owner in alive:
            first.setdefault(owner, t)
            last[owner] = t
    busy: dict[int, int] = {}  # ink slot -> last frame of the owner holding it
    out = {}
    for owner in sorted(first, key=lambda o: (first[o], _natural_key(o))):
        slot = 0
        while slot in busy and busy[slot] >= first[owner]:
            slot += 1
        busy[slot] = last[owner]
        out[owner] = _ink(slot)
    return out
