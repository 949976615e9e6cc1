"""One reproduced result: our figures beside the paper's, printed as a table and saved as JSON.

A :class:`PaperResult` says what was compared (``rows``: a label, the paper's number, ours),
whether ours is **simulated** (a memory-only replay, no model) or **measured** (the real engine,
timed here), how it was run (``settings``), and keeps everything a plot needs (``data``).
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

KINDS = ("simulated", "measured", "computed")


@dataclass
class Row:
    """One compared quantity: ``paper`` is None where the paper gives no number."""

    label: str
    ours: float | str | None
    paper: float | str | None = None
    unit: str = ""


@dataclass
class PaperResult:
    name: str
    title: str
    kind: str  # "simulated" (replay without a model), "measured" (the engine, timed) or "computed" (arithmetic)
    rows: list[Row] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    quick: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    def add(self, label: str, ours: float | str | None, paper: float | str | None = None, unit: str = "") -> None:
        self.rows.append(Row(label, ours, paper, unit))

    def to_dict(self) -> dict:
        return {**asdict(self), "machine": machine()}

    def save(self, folder: str | Path) -> Path:
        """Write ``NAME.json`` (``NAME.quick.json`` for a quick run) into ``folder``; returns the path."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}{'.quick' if self.quick else ''}.json"
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    def print(self) -> None:
        print(f"\n== {self.title} [{self.kind}{', quick' if self.quick else ''}]")
        if self.rows:
            width = max(len(r.label) for r in self.rows) + 2
            print(f"  {'':<{width}}{'ours':>14}{'paper':>14}")
            for r in self.rows:
                print(f"  {r.label:<{width}}{_fmt(r.ours, r.unit):>14}{_fmt(r.paper, r.unit):>14}")
        for note in self.notes:
            print(f"  - {note}")


def _fmt(value: float | str | None, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "x":
        return f"{value:.2f}x"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return f"{text} {unit}".rstrip()


def machine() -> dict:
    """Where a measurement ran: it says what the timings mean."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def load(folder: str | Path, name: str) -> dict | None:
    """The saved result ``NAME.json`` in ``folder`` (a full run), else ``NAME.quick.json``, else None."""
    for path in (Path(folder) / f"{name}.json", Path(folder) / f"{name}.quick.json"):
        if path.exists():
            return json.loads(path.read_text())
    return None
