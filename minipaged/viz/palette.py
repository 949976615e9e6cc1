"""Every colour the pictures use, one name per meaning, so that a colour means the same in every figure.

Memory systems: paged blue, a contiguous cache reserving ``max_seq_len`` orange, one reserving
exactly prompt + output purple (:func:`series_color`). Blocks: free light grey, a shared block outlined
in vermillion, a free block still holding a cached prefix pale blue and dotted. Sequences
(:data:`SEQUENCE_COLORS`: Okabe-Ito's colours, safe for colour-vision deficiencies, then Paul Tol's;
never vermillion): ``A`` blue, ``B`` orange, ... Sequences alive at once never share a colour
(:func:`owner_inks`, :func:`inks_over_time`); past the last colour they come round hatched (:class:`Ink`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from matplotlib.colors import to_rgb

PAGED, CONTIGUOUS_MAX, CONTIGUOUS_EXACT = "#0072B2", "#E69F00", "#CC79A7"
CONTIGUOUS_POW2 = "#009E73"  # a contiguous cache reserving the next power of two (the paper's Orca (Pow2))
RESERVED = "#56B4E9"  # slots reserved for a sequence's later tokens, not yet written
SHARED = "#D55E00"  # vermillion: a block with ref_cnt > 1 (and, in timelines, a preemption)
FREE, WASTE, IN_USE = "#EEEEEE", "#BBBBBB", "#9E9E9E"  # IN_USE: held by an owner the caller did not name
CACHED, CACHED_HATCH = "#D6EAF8", ".."  # a free block that still holds a cached prefix
EMPTY_HATCH = "///"  # slots reserved but empty
MUTED = "#666666"  # secondary text
# What a sequence did in an engine step (stage 5); idle = running but not scheduled (budget spent).
STATE_COLORS = {"waiting": "#DDDDDD", "prefill": "#E69F00", "decode": "#0072B2", "preempted": SHARED, "idle": "#9ECAE1"}
# Okabe-Ito without vermillion (shared) and black, then Paul Tol's muted.
SEQUENCE_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442"]
SEQUENCE_COLORS += ["#332288", "#882255", "#999933", "#44AA99", "#CC6677", "#A6761D"]
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
    """The colour of a memory system named ``label``; a bare ``"contiguous"`` reserves ``max_seq_len``."""
    key = label.lower()
    return PAGED if "paged" in key else CONTIGUOUS_EXACT if "exact" in key else CONTIGUOUS_MAX


def owner_color(k: int) -> str:
    """The colour of the ``k``-th sequence (``A`` = 0, ``B`` = 1, ...), or of a kernel's ``k``-th loop step."""
    return SEQUENCE_COLORS[k % len(SEQUENCE_COLORS)]


def _natural_key(owner: Hashable) -> tuple:
    if isinstance(owner, int) and not isinstance(owner, bool):
        return (0, owner)
    return (1, [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(owner))])


def natural_order(owners: Iterable[Hashable]) -> list[Hashable]:
    """Distinct owners as a reader would order them: ints first, ``"seq 2"`` before ``"seq 10"``."""
    return sorted(dict.fromkeys(owners), key=_natural_key)


def _ink(slot: int) -> Ink:
    n = len(SEQUENCE_COLORS)
    return Ink(SEQUENCE_COLORS[slot % n], OVERFLOW_HATCHES[(slot // n) % len(OVERFLOW_HATCHES)])


def owner_inks(owners: Iterable[Hashable]) -> dict[Hashable, Ink]:
    """An :class:`Ink` per owner, all different: the owners of one picture are alive at once.

    In natural order, the k-th string owner prefers colour k, an int owner (a request id) colour
    ``owner % 12``; a colour already taken moves the owner on to the next free one.
    """
    n, taken, out = len(SEQUENCE_COLORS), set(), {}
    for rank, owner in enumerate(natural_order(owners)):
        first = owner if isinstance(owner, int) and not isinstance(owner, bool) else rank
        slot = next(c for c in (s // n * n + (first + s) % n for s in itertools.count()) if c not in taken)
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
        slot = next(s for s in range(len(busy) + 1) if busy.get(s, -1) < first[owner])
        busy[slot] = last[owner]
        out[owner] = _ink(slot)
    return out
