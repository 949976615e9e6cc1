"""Pictures of contiguous KV memory (stage 0) and of its waste, next to paged memory (stages 1-2).

Every function takes plain state and returns a ``matplotlib.figure.Figure``; none of them shows
it. Patches carry a ``gid`` (``"used"``, ``"empty"``, ``"hole"``) so tests can count them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from minipaged.viz.style import FONT_SIZE, FREE, PALETTE, WASTE, new_figure, owner_color

# One colour and one line style per memory system, the same in every figure.
SYSTEM_STYLE = {
    "contiguous": {"color": PALETTE[5], "linestyle": "-"},
    "paged": {"color": PALETTE[0], "linestyle": "--"},
}
EMPTY_HATCH = "///"


def owner_colors(owners: Sequence[Hashable]) -> dict[Hashable, str]:
    """A colour per owner: an int owner keeps its own colour across figures, others go by order."""
    colors, next_index = {}, 0
    for owner in owners:
        if owner in colors:
            continue
        if isinstance(owner, int) and not isinstance(owner, bool):
            colors[owner] = owner_color(owner)
        else:
            colors[owner] = owner_color(next_index)
            next_index += 1
    return colors


def _reservations_of(arena_or_reservations, num_slots: int | None, used: Mapping | None):
    """(num_slots, {owner: (start, size)}, {owner: used}) from an arena, a cache or plain data."""
    source = arena_or_reservations
    if hasattr(source, "arena") and hasattr(source, "num_tokens"):  # a ContiguousKVCache
        used = dict(source.num_tokens) if used is None else used
        source = source.arena
    if hasattr(source, "reservations") and hasattr(source, "num_slots"):  # a FirstFitArena
        num_slots = source.num_slots if num_slots is None else num_slots
        reservations = source.reservations()
    else:
        reservations = dict(source)
        if num_slots is None:
            num_slots = max((start + size for start, size in reservations.values()), default=0)
    used = {} if used is None else dict(used)
    return num_slots, dict(sorted(reservations.items(), key=lambda kv: kv[1][0])), used


def _holes(reservations: Mapping[Hashable, tuple[int, int]], num_slots: int) -> list[tuple[int, int]]:
    holes, cursor = [], 0
    for start, size in sorted(reservations.values()):
        if start > cursor:
            holes.append((cursor, start - cursor))
        cursor = max(cursor, start + size)
    if cursor < num_slots:
        holes.append((cursor, num_slots - cursor))
    return holes


def draw_memory_map(
    arena_or_reservations,
    num_slots: int | None = None,
    used: Mapping[Hashable, int] | None = None,
    title: str | None = None,
    width: float = 12,
    label_min_frac: float = 0.035,
) -> Figure:
    """The slot address space as one bar: each reservation in its owner's colour, holes in grey.

    ``arena_or_reservations`` is a :class:`~minipaged.kv.contiguous.FirstFitArena`, a
    :class:`~minipaged.kv.contiguous.ContiguousKVCache` (its ``num_tokens`` give ``used``) or a
    plain ``{owner: (start, size)}`` (then pass ``num_slots``). A reservation's first ``used[owner]``
    slots hold tokens (solid); the rest is reserved but empty (hatched: internal waste). Holes
    between reservations are free (light grey); when many small holes add up to more than the
    largest one, that is external fragmentation. Owners are written on reservations wide enough
    (``label_min_frac`` of the bar).
    """
    num_slots, reservations, used = _reservations_of(arena_or_reservations, num_slots, used)
    if num_slots < 1:
        raise ValueError("nothing to draw: give num_slots for an empty reservation map")
    fig, ax = new_figure(width, 2.6)
    colors = owner_colors(list(reservations))
    for owner, (start, size) in reservations.items():
        n_used = max(0, min(int(used.get(owner, 0)), size))
        color = colors[owner]
        if n_used:
            ax.add_patch(Rectangle((start, 0), n_used, 1, facecolor=color, edgecolor="black", lw=0.8, gid="used"))
        if size > n_used:
            ax.add_patch(Rectangle((start + n_used, 0), size - n_used, 1, facecolor="white", edgecolor=color,
                                   hatch=EMPTY_HATCH, lw=0.8, gid="empty"))
        ax.add_patch(Rectangle((start, 0), size, 1, fill=False, edgecolor="black", lw=1.5))
        if size >= label_min_frac * num_slots:
            ax.text(start + size / 2, 1.12, str(owner), ha="center", va="bottom", fontsize=FONT_SIZE - 2)
    holes = _holes(reservations, num_slots)
    for start, size in holes:
        ax.add_patch(Rectangle((start, 0), size, 1, facecolor=FREE, edgecolor=WASTE, lw=0.8, gid="hole"))
    ax.set_xlim(0, num_slots)
    ax.set_ylim(0, 1.6)
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    ax.set_xlabel("slot address")
    reserved = sum(size for _, size in reservations.values())
    n_used = sum(max(0, min(int(used.get(o, 0)), s)) for o, (_, s) in reservations.items())
    free = num_slots - reserved
    largest = max((size for _, size in holes), default=0)
    summary = (f"{len(reservations)} reservations, {n_used}/{reserved} reserved slots hold tokens; "
               f"{free} free in {len(holes)} holes (largest {largest})")
    ax.set_title(f"{title}\n{summary}" if title else summary, loc="left")
    ax.legend(handles=[
        Patch(facecolor=PALETTE[0], edgecolor="black", label="holds tokens"),
        Patch(facecolor="white", edgecolor=PALETTE[0], hatch=EMPTY_HATCH, label="reserved, empty"),
        Patch(facecolor=FREE, edgecolor=WASTE, label="free hole"),
    ], loc="upper center", bbox_to_anchor=(0.5, -0.45), ncols=3, frameon=False)
    return fig


def draw_waste(
    reserved: Mapping[Hashable, int],
    used: Mapping[Hashable, int],
    title: str | None = None,
    unit: str = "slots",
) -> Figure:
    """One bar per owner: the slots it holds tokens in (solid) and the rest of its memory (hatched).

    ``reserved[owner]`` is what the owner was given (a ``max_seq_len`` reservation, or
    ``len(blocks) * block_size`` for a paged sequence), ``used[owner]`` its tokens. The title
    gives the total waste in percent.
    """
    owners = list(reserved)
    if not owners:
        raise ValueError("nothing to draw: no owners")
    fig, ax = new_figure(10, 0.55 * len(owners) + 1.8)
    colors = owner_colors(owners)
    for row, owner in enumerate(owners):
        size, n_used = int(reserved[owner]), max(0, min(int(used.get(owner, 0)), int(reserved[owner])))
        y = len(owners) - 1 - row
        ax.add_patch(Rectangle((0, y - 0.35), n_used, 0.7, facecolor=colors[owner], edgecolor="black", lw=0.8,
                               gid="used"))
        if size > n_used:
            ax.add_patch(Rectangle((n_used, y - 0.35), size - n_used, 0.7, facecolor="white", edgecolor=colors[owner],
                                   hatch=EMPTY_HATCH, lw=0.8, gid="empty"))
        pct = 0.0 if size == 0 else 100 * (1 - n_used / size)
        ax.text(size, y, f" {pct:.0f}% empty", va="center", fontsize=FONT_SIZE - 2)
    ax.set_yticks(range(len(owners)), [str(o) for o in reversed(owners)])
    ax.set_ylim(-0.7, len(owners) - 0.3)
    ax.set_xlim(0, max(int(v) for v in reserved.values()) * 1.2 or 1)
    ax.set_xlabel(unit)
    total = sum(int(v) for v in reserved.values())
    total_used = sum(max(0, min(int(used.get(o, 0)), int(reserved[o]))) for o in owners)
    waste = 0.0 if total == 0 else 100 * (1 - total_used / total)
    summary = f"{total_used}/{total} {unit} hold tokens: {waste:.1f}% wasted"
    ax.set_title(f"{title}\n{summary}" if title else summary, loc="left")
    return fig


def draw_fragmentation(result: Mapping, num_slots: int | None = None, title: str | None = None) -> Figure:
    """Memory systems side by side over one replay: memory holding tokens, external fragmentation, admissions.

    ``result`` is the output of :func:`minipaged.sim.simulate_contiguous_vs_paged`, or any
    dict of ``{label: series}`` with such series (e.g. two contiguous runs with different
    reservations); ``"time"`` and ``"totals"`` are ignored. Top: slots holding tokens (thick) and
    allocated (dotted) per system, in percent of ``num_slots`` when given; the gap between one
    system's two lines is its internal waste. Middle: the share of free memory outside the
    largest hole (paged is 0 by construction). Bottom: requests admitted so far (cumulative).
    """
    systems = {k: v for k, v in result.items() if k not in ("time", "totals")}
    if not systems:
        raise ValueError("nothing to draw: no series in result")
    fig, axes = new_figure(11, 8, nrows=3, sharex=True)
    scale = 100 / num_slots if num_slots else 1
    # Systems with other names (e.g. two contiguous variants) get further colours and dashes.
    extra = [(PALETTE[5], "-"), (PALETTE[2], "--"), (PALETTE[3], "-."), (PALETTE[1], (0, (1, 1)))]
    for i, (name, series) in enumerate(systems.items()):
        color, linestyle = extra[i % len(extra)]
        style = SYSTEM_STYLE.get(name, {"color": color, "linestyle": linestyle})
        x = range(len(series["admitted"]))  # each replay runs until its own last request is done
        axes[0].plot(x, [v * scale for v in series["used_slots"]], lw=2.2, label=f"{name}: holds tokens", **style)
        axes[0].plot(x, [v * scale for v in series["allocated_slots"]], lw=1.2, alpha=0.9,
                     label=f"{name}: allocated", color=style["color"], linestyle=":")
        axes[1].plot(x, [100 * v for v in series["external_fragmentation"]], lw=2, label=name, **style)
        axes[2].plot(x, series["admitted"], lw=2.2, label=name, **style)
    axes[0].set_ylabel("% of KV memory" if num_slots else "slots")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel("external\nfragmentation %")
    axes[1].set_ylim(-3, 103)
    axes[2].set_ylabel("requests\nadmitted")
    axes[2].set_xlabel("step")
    for ax in axes:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    axes[0].set_title(title or "The same trace, the same memory", loc="left")
    return fig
