"""Every reproduced result by name: the function, its quick and full sizes, and the paper's numbers.

``python -m minipaged paper NAME`` runs the full size (``paper all`` every figure, sized to about
30 minutes on 2 CPU cores); ``--quick`` a small size of each (about 2 minutes together) that
shows the figure is real, not that its numbers are settled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minipaged.paper import (
    block_size,
    kv_bytes,
    preemption,
    regime,
    reservation,
    serving,
    shared_prefix,
    sharing,
)
from minipaged.paper.report import PaperResult


@dataclass(frozen=True)
class Entry:
    """A figure: its function (whose defaults are the full sizes), the quick sizes, overrides of the
    full sizes, the paper's numbers and where they are in the paper."""

    run: Callable[..., PaperResult]
    quick: dict = field(default_factory=dict)
    full: dict = field(default_factory=dict)
    paper: dict = field(default_factory=dict)
    section: str = ""


FIGURES: dict[str, Entry] = {
    "kv-bytes": Entry(kv_bytes.kv_bytes_table, paper=kv_bytes.PAPER, section="§3"),
    "fig2": Entry(
        reservation.memory_waste,
        quick=dict(num_requests=150, seeds=(0,)),
        paper=reservation.PAPER_FIG2,
        section="Fig. 2",
    ),
    "fig13": Entry(
        reservation.batch_size,
        quick=dict(sharegpt_requests=150, alpaca_requests=800, seeds=(0,)),
        paper=reservation.PAPER_FIG13,
        section="Fig. 13",
    ),
    "fig12": Entry(
        serving.latency_vs_rate,
        quick=dict(capacity_requests=6, capacity_window=3, curve_requests=3, rate_fractions=(0.25, 1.0), max_output=6),
        paper=serving.PAPER,
        section="Fig. 12",
    ),
    "fig15": Entry(
        sharing.memory_saved,
        quick=dict(num_requests=2, max_tokens=16, model=None),  # memory only: the embedded model is enough
        paper=sharing.PAPER,
        section="Fig. 15",
    ),
    "fig16": Entry(
        shared_prefix.prefix_throughput,
        quick=dict(num_requests=3, max_output=6),
        paper=shared_prefix.PAPER,
        section="Fig. 16",
    ),
    "fig18b": Entry(
        block_size.block_size_sweep,
        quick=dict(
            block_sizes=(1, 4, 16, 64, 256),
            sharegpt_requests=150,
            alpaca_requests_sim=800,
            engine_requests=3,
            engine_block_sizes=(4, 16, 64),
            max_output=6,
        ),
        paper=block_size.PAPER,
        section="Fig. 18b",
    ),
    "fig19": Entry(
        preemption.swap_vs_recompute,
        quick=dict(block_sizes=(8, 32), num_requests=6, max_output=16, slots=128, model=None),  # a pool that preempts
        paper=preemption.PAPER,
        section="Fig. 19",
    ),
    "regime": Entry(
        regime.throughput_regime,
        quick=dict(num_requests=6, repeats=1, rows=(1, 4, 16), decode_steps=2, max_output=8),
        paper={"throughput": regime.PAPER},
        section="§6.2",
    ),
}


def run(name: str, quick: bool = False, **overrides: Any) -> PaperResult:
    """Run figure ``name`` at its quick or full size (``overrides`` change single settings)."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}: choose from {', '.join(FIGURES)}")
    entry = FIGURES[name]
    return entry.run(**{**(entry.quick if quick else entry.full), **overrides, "quick": quick})
