"""Pictures of contiguous KV memory (stage 0) and of its waste, next to paged memory (stages 1-2).

:func:`draw_memory_map` draws a :class:`MemoryMap` (from an arena or a contiguous cache),
:func:`draw_waste` each owner's share of empty slots, :func:`draw_fragmentation` a replay of memory
systems side by side. Patches carry a ``gid`` (``"used"``, ``"empty"``, ``"hole"``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from minipaged.kv.contiguous import ContiguousKVCache, FirstFitArena
from minipaged.viz.palette import EMPTY_HATCH, FREE, WASTE, owner_inks, series_color
from minipaged.viz.style import FONT_SIZE, SMALL, box, new_figure, new_grid

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType


def draw_memory_map(
    memory: FirstFitArena | ContiguousKVCache,
    num_slots: int | None = None,
    used: Mapping[Hashable, int] | None = None,
    title: str | None = None,
    width: float = 12,
    label_min_frac: float = 0.035,
) -> Figure:
    """The slot address space as one bar: each reservation in its owner's colour, holes in grey.

    ``memory``: stage 0's arena (``used``: owner -> slots holding tokens) or a contiguous cache (its
    arena and ``num_tokens``); ``num_slots`` overrides the length of the bar. A reservation's first
    ``used[owner]`` slots hold tokens (solid), the rest is reserved but empty (hatched: internal
    waste). Holes are free (grey); many small holes adding up to more than the largest one are
    external fragmentation. Owners are written on reservations at least ``label_min_frac`` wide.
    """
    if isinstance(memory, ContiguousKVCache):
        used = memory.num_tokens
        memory = memory.arena
    reservations, holes = memory.reservations(), memory.holes()
    tokens = {o: max(0, min(int((used or {}).get(o, 0)), size)) for o, (_, size) in reservations.items()}
    total = memory.num_slots if num_slots is None else num_slots
    if total < 1:
        raise ValueError("nothing to draw: the map has no slots")
    fig, ax = new_figure(width, 2.8)
    inks = owner_inks(reservations)
    for owner, (start, size) in reservations.items():
        full = tokens[owner] / max(size, 1)  # solid; the rest hatched in the owner's colour: reserved, empty
        box(ax, (start, 0, size, 1), inks[owner], full, ec="black", lw=1.5, hatch=EMPTY_HATCH)
        if size >= label_min_frac * total:
            ax.text(start + size / 2, 1.12, str(owner), ha="center", va="bottom", fontsize=FONT_SIZE - 2)
    for start, size in holes:
        ax.add_patch(Rectangle((start, 0), size, 1, fc=FREE, ec=WASTE, lw=0.8, gid="hole"))
    ax.set(xlim=(0, total), ylim=(0, 1.6), yticks=[], xlabel="slot address")
    ax.spines["left"].set_visible(False)
    reserved, largest = sum(size for _, size in reservations.values()), max((size for _, size in holes), default=0)
    summary = f"{len(reservations)} reservations, {sum(tokens.values())}/{reserved} reserved slots hold tokens; "
    summary += f"{sum(size for _, size in holes)} free in {len(holes)} holes (largest {largest})"
    ax.set_title(f"{title}\n{summary}" if title else summary, loc="left")
    handles = [Patch(fc="#777777", ec="black", label="holds tokens (owner's colour)")]
    handles += [Patch(fc="white", ec="#777777", hatch=EMPTY_HATCH, label="reserved, empty")]
    handles += [Patch(fc=FREE, ec=WASTE, label="free hole")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncols=3, frameon=False)
    return fig


def draw_waste(
    reserved: Mapping[Hashable, int], used: Mapping[Hashable, int], title: str | None = None, unit: str = "slots"
) -> Figure:
    """One bar per owner: the slots it holds tokens in (solid) and the rest of its memory (hatched).

    ``reserved[owner]``: what it was given (a ``max_seq_len`` reservation, or ``len(blocks) *
    block_size`` for a paged sequence); ``used[owner]``: its tokens. The title gives the total waste.
    """
    owners = list(reserved)
    if not owners:
        raise ValueError("nothing to draw: no owners")
    fig, ax = new_figure(10, 0.55 * len(owners) + 1.8)
    inks = owner_inks(owners)
    fills = {o: max(0, min(int(used.get(o, 0)), int(reserved[o]))) for o in owners}
    for row, owner in enumerate(owners):
        size, y = int(reserved[owner]), len(owners) - 1 - row
        full = fills[owner] / size if size else 1.0
        box(ax, (0, y - 0.35, size, 0.7), inks[owner], full, ec="black", hatch=EMPTY_HATCH)
        ax.text(size, y, f" {100 * (1 - full):.0f}% empty", va="center", fontsize=FONT_SIZE - 2)
    ax.set_yticks(range(len(owners)), [str(o) for o in reversed(owners)])
    ax.set(ylim=(-0.7, len(owners) - 0.3), xlim=(0, max(int(v) for v in reserved.values()) * 1.2 or 1), xlabel=unit)
    total, total_used = sum(int(v) for v in reserved.values()), sum(fills.values())
    summary = f"{total_used}/{total} {unit} hold tokens: {100 * (1 - total_used / total) if total else 0:.1f}% wasted"
    ax.set_title(f"{title}\n{summary}" if title else summary, loc="left")
    return fig


LINESTYLES: dict[str, LineStyleType] = {"paged": "--", "contiguous, max_seq_len": "-", "contiguous, exact": "-."}


def draw_fragmentation(result: Mapping[str, Any], num_slots: int | None = None, title: str | None = None) -> Figure:
    """Memory systems side by side over one replay: memory holding tokens, external fragmentation, admissions.

    ``result``: :func:`minipaged.sim.simulate_contiguous_vs_paged`'s output, or any ``{label: series}``
    with such series (``"time"``, ``"totals"``, ``"reserve"`` are not series). Each system keeps its
    colour (:func:`~minipaged.viz.palette.series_color`; a bare ``"contiguous"`` reserves
    ``max_seq_len`` unless ``result["reserve"]`` is ``"exact"``). Top: slots holding tokens (thick)
    and allocated (dotted), in percent of ``num_slots`` when given: the gap is internal waste.
    Middle: the share of free memory outside the largest hole. Bottom: requests admitted so far.
    """
    systems = {k: v for k, v in result.items() if k not in ("time", "totals", "reserve")}
    if not systems:
        raise ValueError("nothing to draw: no series in result")
    fig, grid = new_grid(12, 7.6, nrows=3, sharex=True)
    axes = [row[0] for row in grid]
    scale = 100 / num_slots if num_slots else 1
    handles: list[Line2D] = []
    for name, series in systems.items():
        label = f"{name}, {result['reserve']}" if name == "contiguous" and "reserve" in result else name
        color, ls = series_color(label), LINESTYLES.get(label, LINESTYLES.get(name, "-"))
        x = range(len(series["admitted"]))  # each replay runs until its own last request is done
        axes[0].plot(x, [v * scale for v in series["used_slots"]], lw=2.2, color=color, linestyle=ls)
        axes[0].plot(x, [v * scale for v in series["allocated_slots"]], lw=1.2, color=color, linestyle=":")
        axes[1].plot(x, [100 * v for v in series["external_fragmentation"]], lw=2, color=color, linestyle=ls)
        axes[2].plot(x, series["admitted"], lw=2.2, label=label, color=color, linestyle=ls)
        handles.append(Line2D([], [], lw=2.5, label=label, color=color, linestyle=ls))
    handles.append(Line2D([], [], color="black", lw=2.2, label="thick: holds tokens"))
    handles.append(Line2D([], [], color="black", lw=1.2, linestyle=":", label="dotted: allocated"))
    axes[0].set(ylabel="% of KV memory" if num_slots else "slots", ylim=(0, None))
    axes[1].set(ylabel="external\nfragmentation %", ylim=(-3, 103))
    axes[2].set(ylabel="requests\nadmitted", xlabel="step")
    fig.legend(handles=handles, loc="outside right upper", frameon=False, fontsize=SMALL + 2)
    axes[0].set_title(title or "The same trace, the same memory", loc="left")
    return fig
