"""What the projector page draws, computed from step snapshots (:mod:`minipaged.viz.snapshot`): pure functions.

:func:`step_events` names what a step did to the pool, read off two consecutive
:class:`StepSnapshot` s (:mod:`minipaged.viz.step_events`), for the page to flash:
copy-on-write (a sequence's block table changed at an index it already had), prefix-cache hits
(the leading blocks of a sequence admitted this step that were already computed) and evictions
(blocks that were free but still cached, and now hold something else).

:func:`frame` turns one snapshot into the JSON the page draws: every block (``ref_cnt``,
cached or not, its owners), the running and waiting requests with their block tables, the inks
of the course's palette, and the figures passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minipaged.viz import palette
from minipaged.viz.snapshot import StepSnapshot
from minipaged.viz.step_events import step_events as events_between

EVENT_KINDS = ("cow", "hits", "evicted", "preempted")


def no_events() -> dict:
    return {k: [] for k in EVENT_KINDS}


def step_events(prev: StepSnapshot | None, cur: StepSnapshot, block_size: int) -> dict:
    """What one step did to the pool (:func:`minipaged.viz.step_events.step_events`), as the page
    flashes it: ``cow`` [(old block, new block)], ``hits`` [block], ``evicted`` [block],
    ``preempted`` [seq id]."""
    ev = events_between(prev, cur, block_size)
    hits = [b for blocks in ev.hits.values() for b in blocks]
    return {"cow": [(a, b) for _, a, b in ev.cow], "hits": hits, "evicted": ev.evicted, "preempted": ev.preempted}


def merge_events(into: dict, more: dict) -> dict:
    for k in EVENT_KINDS:
        into[k] += more[k]
    return into


def frame(
    snap: StepSnapshot,
    seqs: Mapping[int, tuple[int, int]],
    labels: Mapping[int, str],
    events: dict,
    figures: dict,
    num_blocks: int,
    block_size: int,
) -> dict:
    """The page's picture after ``snap``.

    seqs: seq id -> (request id, sample index) for every running or waiting sequence;
    labels: request id -> the name shown for it. Returns a JSON-ready dict: ``blocks`` holds
    one ``[ref_cnt, cached (0/1), [owner request ids]]`` per physical block (empty for a
    contiguous cache, which has no blocks to draw), ``running`` / ``waiting`` the requests in
    queue order, ``inks`` request id -> [colour, hatch or null].
    """
    owners: dict[int, list[int]] = {}
    for seq, table in snap.block_tables.items():
        rid = seqs.get(seq, (-1, 0))[0]
        for b in table:
            holders = owners.setdefault(b, [])
            if rid not in holders:
                holders.append(rid)
    blocks = [[ref, int(cached), owners.get(b, [])] for b, (ref, cached) in enumerate(zip(snap.ref_cnt, snap.cached))]
    scheduled = {s["seq_id"]: s["kind"] for s in snap.scheduled}
    running: dict[int, dict] = {}
    for seq in snap.running:
        rid, sample = seqs.get(seq, (-1, 0))
        entry = running.setdefault(rid, {"id": rid, "label": labels.get(rid, f"R{rid}"), "samples": []})
        entry["samples"].append(
            {
                "seq": seq,
                "sample": sample,
                "blocks": snap.block_tables.get(seq, []),
                "tokens": snap.num_tokens.get(seq, 0),
                "state": scheduled.get(seq, "idle"),
            }
        )
    waiting: list[dict[str, Any]] = []  # JSON for the page
    for seq in snap.waiting:
        rid = seqs.get(seq, (-1, 0))[0]
        if not any(w["id"] == rid for w in waiting):
            waiting.append({"id": rid, "label": labels.get(rid, f"R{rid}")})
    alive = list(running) + [w["id"] for w in waiting]
    inks = {str(rid): [ink.color, ink.hatch] for rid, ink in palette.owner_inks(alive).items()}
    return {
        "step": snap.step,
        "num_blocks": num_blocks,
        "block_size": block_size,
        "blocks": blocks,
        "running": list(running.values()),
        "waiting": waiting,
        "inks": inks,
        "events": {
            "cow": [list(pair) for pair in events["cow"]],
            "hits": events["hits"],
            "evicted": events["evicted"],
            "preempted": sorted({seqs.get(s, (-1, 0))[0] for s in events["preempted"]}),
        },
        "figures": figures,
    }


def page_palette() -> dict:
    """The colours the page uses for block states, from the course's palette."""
    return {
        "free": palette.FREE,
        "in_use": palette.IN_USE,
        "shared": palette.SHARED,
        "cached": palette.CACHED,
        "muted": palette.MUTED,
        "states": palette.STATE_COLORS,
    }
