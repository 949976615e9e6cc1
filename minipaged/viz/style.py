"""One look for every figure: colour-blind-safe colours, fonts readable on a projector.

Render functions take state and return a ``matplotlib.figure.Figure``; they never show it, so
notebooks, widgets and ``save_figure`` (PNG/SVG for slides) all share them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
from matplotlib.figure import Figure

# Okabe-Ito: distinguishable with every common colour-vision deficiency.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
FREE = "#EEEEEE"
SHARED_EDGE = "#D55E00"
WASTE = "#BBBBBB"
FONT_SIZE = 14
# Big type for projectors; applied when minipaged.viz is imported.
STYLE = {"font.size": FONT_SIZE, "axes.titlesize": FONT_SIZE + 2, "axes.labelsize": FONT_SIZE,
         "legend.fontsize": FONT_SIZE - 2, "axes.spines.top": False, "axes.spines.right": False,
         "axes.prop_cycle": mpl.cycler(color=PALETTE), "svg.fonttype": "none"}
mpl.rcParams.update(STYLE)


def owner_color(i: int) -> str:
    """A stable colour for the i-th owner (sequence, request)."""
    return PALETTE[i % (len(PALETTE) - 1)]  # black is kept for text and outlines


def new_figure(width: float = 10, height: float = 4, **kwargs) -> tuple[Figure, object]:
    """A figure and its axes with the project's fonts; not attached to pyplot's global state."""
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(**kwargs)


def save_figure(fig: Figure, path: str | Path, dpi: int = 150) -> Path:
    """Write a figure for slides; the suffix picks the format (``.png``, ``.svg``, ``.pdf``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    """PNG bytes of a figure, for an ``ipywidgets.Image`` that a widget observer updates."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()
