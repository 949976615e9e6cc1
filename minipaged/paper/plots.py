"""Pictures of the reproduced results, from the dicts the figures save (``docs/paper/NAME.json``).

Pure render functions (saved result -> ``matplotlib`` Figure), so notebook 07 draws the
committed full run and a live quick run alike. Ours is drawn in colour, the paper's in grey.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from minipaged.viz.palette import (
    CONTIGUOUS_EXACT,
    CONTIGUOUS_MAX,
    CONTIGUOUS_POW2,
    FREE,
    MUTED,
    PAGED,
    RESERVED,
    SEQUENCE_COLORS,
    WASTE,
)
from minipaged.viz.style import new_figure, new_grid

PAPER_GREY = "#9E9E9E"
SYSTEM_COLORS = {
    "orca-max": CONTIGUOUS_MAX, "orca-pow2": CONTIGUOUS_POW2, "orca-oracle": CONTIGUOUS_EXACT, "paged": PAGED
}  # fmt: skip
OURS, THEIRS = SEQUENCE_COLORS[0], SEQUENCE_COLORS[1]  # two series of one plot: ours, and the other
SYSTEM_NAMES = {"orca-max": "Orca (Max)", "orca-pow2": "Orca (Pow2)", "orca-oracle": "Orca (Oracle)", "paged": "paged"}


def _title(result: dict) -> str:
    return f"{result['title']}  [{result['kind']}{', quick run' if result['quick'] else ''}]"


def draw_beside_paper(result: dict, unit: str | None = None) -> Figure:
    """Every row of ``result`` that has a numeric paper value: ours beside the paper's (grey)."""
    rows = [r for r in result["rows"] if isinstance(r["paper"], (int, float)) and isinstance(r["ours"], (int, float))]
    if unit is not None:
        rows = [r for r in rows if r["unit"] == unit]
    fig, ax = new_figure(11, 0.5 * len(rows) + 1.8)
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r["ours"] for r in rows], height=0.4, color=OURS, label="ours")
    ax.barh([i - 0.2 for i in y], [r["paper"] for r in rows], height=0.4, color=PAPER_GREY, label="paper")
    ax.set_yticks(list(y), [r["label"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(rows[0]["unit"] if rows and rows[0]["unit"] else "")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(_title(result), loc="left")
    return fig


def draw_memory_shares(result: dict, trace: str = "sharegpt") -> Figure:
    """Fig. 2: where each system's KV memory goes, stacked; the paper's token share as a tick.

    ``trace``: ``"sharegpt"`` (lognormal lengths) or ``"sharegpt-real"`` (the real file's lengths).
    """
    data = result["data"] if trace == "sharegpt" else result["data"][trace]
    names_in = set(SYSTEM_NAMES.values())
    paper = {part: r["paper"] for r in result["rows"] for part in r["label"].split(", ") if part in names_in}
    parts: tuple[tuple[str, str, str], ...] = (
        ("tokens", PAGED, "token states"),
        ("reservation", RESERVED, "reserved for later tokens"),
    )
    parts += (("internal", WASTE, "never filled"), ("free", FREE, "free, unusable"))
    fig, ax = new_figure(11, 4)
    names = [s for s in SYSTEM_NAMES if s in data]
    for i, system in enumerate(names):
        left = 0.0
        for key, color, label in parts:
            width = 100 * data[system][key]
            ax.barh(i, width, left=left, color=color, edgecolor="white", label=label if i == 0 else None)
            left += width
        mark = paper.get(SYSTEM_NAMES[system])
        if mark is not None:
            ax.plot(
                [mark, mark], [i - 0.4, i + 0.4], color="black", lw=3, label="paper: token states" if i == 0 else None
            )
    ax.set_yticks(range(len(names)), [SYSTEM_NAMES[s] for s in names])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of KV memory (steps with a queue waiting)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=5, fontsize=10)
    ax.set_title(f"{_title(result)}  {trace}", loc="left")
    return fig


def draw_latency(result: dict) -> Figure:
    """Fig. 12: normalized latency against request rate; dashed lines at each system's capacity."""
    fig, ax = new_figure(10, 4.5)
    for system, curve in result["data"]["curves"].items():
        color = SYSTEM_COLORS[system]
        ax.plot([p["rate"] for p in curve], [p["normalized_latency"] for p in curve], "o-", color=color, label=system)
        ax.axvline(result["data"]["capacity"][system], color=color, ls="--", lw=1)
    ax.set_xlabel("request rate (requests / s)")
    ax.set_ylabel("normalized latency (s / token)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(_title(result), loc="left")
    return fig


def draw_block_size(result: dict) -> Figure:
    """Fig. 18b: memory holding tokens (every trace) and the engine's tokens/s against the block size."""
    fig, [[mem, speed]] = new_grid(12, 4.2, ncols=2)
    colors = {"sharegpt": OURS, "sharegpt-real": SEQUENCE_COLORS[3], "alpaca": THEIRS}
    for trace, shares in result["data"]["memory_tokens_share"].items():  # runs saved before real lengths: two
        mem.plot([int(b) for b in shares], [100 * v for v in shares.values()], "o-", color=colors[trace], label=trace)
    mem.set_ylabel("% of KV memory holding tokens")
    throughput = result["data"]["tokens_per_s"]
    speed.plot([int(b) for b in throughput], list(throughput.values()), "o-", color=SEQUENCE_COLORS[2])
    speed.set_ylabel("engine tokens / s")
    for ax in (mem, speed):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (tokens)")
        ax.axvline(16, color=MUTED, ls=":", lw=1)
    mem.legend()
    fig.suptitle(_title(result), x=0.01, ha="left")
    return fig


def draw_regime(result: dict) -> Figure:
    """The CPU roofline: decode tokens/s against rows, each model relative to its own 1-row speed."""
    fig, ax = new_figure(10, 4.5)
    for key, color, label in (("embedded", THEIRS, "embedded 2M model"), ("smollm2", OURS, "random:smollm2-135m")):
        tps = result["data"][key]["decode_tokens_per_s"]
        base = tps[min(tps, key=int)]
        ax.plot([int(r) for r in tps], [v / base for v in tps.values()], "o-", color=color, label=label)
    rows = [int(r) for r in result["data"]["smollm2"]["decode_tokens_per_s"]]
    ax.plot(rows, [r / min(rows) for r in rows], ":", color=MUTED, label="if a step cost the same at any rows")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("decode rows in a step")
    ax.set_ylabel("tokens / s, relative to 1 row")
    ax.legend()
    ax.set_title(_title(result), loc="left")
    return fig


def draw_swap(result: dict) -> Figure:
    """Fig. 19: time per preempted block, swap against recompute, by block size."""
    fig, ax = new_figure(10, 4.2)
    rows = result["data"]["block_sizes"]
    sizes = [int(b) for b in rows]
    for key, color, label in (
        ("seconds_per_swapped_block", OURS, "swap"),
        ("seconds_per_recomputed_block", THEIRS, "recompute"),
    ):
        ax.plot(sizes, [1e3 * r[key] for r in rows.values()], "o-", color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("ms per preempted block")
    ax.legend()
    ax.set_title(_title(result), loc="left")
    return fig


def draw_step_curve(
    rows: list[int], steps: dict[str, list[float]], floors: dict[str, float], title: str = ""
) -> Figure:
    """The decode step against its rows on a real model: ``steps`` maps a number format to the
    seconds of a step at each of ``rows``; ``floors`` maps it to the seconds it takes to read that
    format's weights once at the measured read bandwidth (the least a step can cost)."""
    fig, ax = new_figure(10, 4.5)
    colors = {"float32": THEIRS, "auto": OURS}
    for name, seconds in steps.items():
        color = colors.get(name, MUTED)
        ax.plot(rows, [1e3 * t for t in seconds], "o-", color=color, label=f"decode step, {name}")
        if name in floors:
            ax.axhline(1e3 * floors[name], ls="--", color=color, label=f"reading the {name} weights once")
    ax.set_xscale("log", base=2)
    ax.set_xticks(rows, [str(r) for r in rows])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("running rows (one new token each)")
    ax.set_ylabel("ms per decode step")
    ax.legend()
    ax.set_title(title or "the decode step against its rows", loc="left")
    return fig
