"""One look for every figure: fonts readable on a projector, sizes that fit one, and the :func:`box`
every block, slot and reservation is drawn with.

Render functions take state and return a ``matplotlib.figure.Figure``; they never show it, so
notebooks, widgets and :func:`save_figure` (PNG/SVG for slides) all share them. A widget shows
:func:`figure_png` at 100 dpi, where the smallest text, :data:`SMALL` (10 pt), is 14 px; figures are
at most :data:`MAX_WIDTH` x :data:`MAX_HEIGHT` inches, so they fit a 1280 x 800 projector unshrunk.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib as mpl
from matplotlib import patheffects
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.rcsetup import cycler

from minipaged.viz.palette import SEQUENCE_COLORS, Ink

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

FONT_SIZE = 14  # body text, axis labels
SMALL = 10  # the smallest text any figure uses: 14 px at 100 dpi
MAX_WIDTH, MAX_HEIGHT = 12.6, 7.8  # inches: within 1280 x 800 px at 100 dpi, margins included
WIDGET_DPI = 100
EDGE = "#444444"  # the outline of a block
HALO = [patheffects.withStroke(linewidth=3, foreground="white")]  # black text that reads on any fill

STYLE: dict[RcKeyType, Any] = {
    "font.size": FONT_SIZE,
    "axes.labelsize": FONT_SIZE,
    "axes.titlesize": FONT_SIZE + 2,
    "svg.fonttype": "none",
}
STYLE |= {key: FONT_SIZE - 2 for key in ("legend.fontsize", "xtick.labelsize", "ytick.labelsize")}
STYLE |= {"axes.spines.top": False, "axes.spines.right": False, "axes.prop_cycle": cycler(color=SEQUENCE_COLORS)}
mpl.rcParams.update(STYLE)  # applied when minipaged.viz is imported


def fit(width: float, height: float) -> tuple[float, float]:
    """(width, height) scaled down, keeping the aspect ratio, to fit MAX_WIDTH x MAX_HEIGHT."""
    shrink = min(1.0, MAX_WIDTH / width, MAX_HEIGHT / height)
    return width * shrink, height * shrink


def new_figure(width: float = 10, height: float = 4) -> tuple[Figure, Axes]:
    """A figure and its one axes (``fig.subplots()``), not attached to pyplot's global state.

    ``width`` x ``height`` inches, scaled down (aspect kept) to fit a 1280 x 800 screen at 100 dpi.
    """
    fig = Figure(figsize=fit(width, height), layout="constrained")
    return fig, fig.subplots()


def new_grid(
    width: float, height: float, nrows: int = 1, ncols: int = 1, **kwargs: Any
) -> tuple[Figure, list[list[Axes]]]:
    """A figure and its ``nrows`` x ``ncols`` axes, ``grid[row][col]`` (``fig.subplots(nrows, ncols,
    squeeze=False, **kwargs)``: ``sharex``, ``gridspec_kw``, ...), sized as :func:`new_figure`."""
    fig = Figure(figsize=fit(width, height), layout="constrained")
    return fig, [list(row) for row in fig.subplots(nrows, ncols, squeeze=False, **kwargs)]


def save_figure(fig: Figure, path: str | Path, dpi: int = 150) -> Path:
    """Write a figure for slides; the suffix picks the format (``.png``, ``.svg``, ``.pdf``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def figure_png(fig: Figure, dpi: int = WIDGET_DPI) -> bytes:
    """PNG bytes of a figure, for an ``ipywidgets.Image`` (keep 100 dpi: text sizes are chosen for it).

    The PNG carries the text drawn in the figure (:func:`png_with_text`), so that what a saved
    picture says can be read without looking at it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return png_with_text(buf.getvalue(), figure_text(fig))


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_TEXT_KEY = "Description"  # a standard PNG text keyword (what the picture shows)


def figure_text(fig: Figure) -> str:
    """Every piece of text drawn in ``fig`` (titles, labels, annotations, legends, tick labels), one a line.

    Tick labels are set when the figure is drawn: call it after ``savefig``.
    """
    from matplotlib.text import Text

    texts = [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return "\n".join(dict.fromkeys(texts))  # in drawing order, each once


def png_with_text(png: bytes, text: str, key: str = PNG_TEXT_KEY) -> bytes:
    """``png`` with an ``iTXt`` chunk ``key: text`` (UTF-8) after its header: the picture is unchanged."""
    import struct
    import zlib

    if not png.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG")
    header_end = len(PNG_SIGNATURE) + 8 + struct.unpack(">I", png[8:12])[0] + 4  # IHDR: length, type, data, crc
    body = key.encode("latin-1") + b"\0\0\0" + b"\0" + b"\0" + text.encode("utf-8")  # no compression, no language
    chunk = struct.pack(">I", len(body)) + b"iTXt" + body + struct.pack(">I", zlib.crc32(b"iTXt" + body))
    return png[:header_end] + chunk + png[header_end:]


def png_text(png: bytes, key: str = PNG_TEXT_KEY) -> str | None:
    """The text :func:`png_with_text` put in ``png`` (``None`` when it has none)."""
    import struct

    if not png.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG")
    at, found = len(PNG_SIGNATURE), []
    while at + 8 <= len(png):
        length, kind = struct.unpack(">I", png[at : at + 4])[0], png[at + 4 : at + 8]
        data = png[at + 8 : at + 8 + length]
        if kind == b"iTXt" and data.split(b"\0", 1)[0] == key.encode("latin-1"):
            found.append(data.split(b"\0", 5)[-1].decode("utf-8"))
        if kind == b"IEND":
            break
        at += 12 + length
    return "\n".join(found) if found else None


def box(
    ax: Axes,
    xywh: tuple[float, float, float, float],
    ink: Ink,
    fill: float = 1.0,
    *,
    text: str = "",
    ec: str = EDGE,
    lw: float = 1.0,
    empty: str | None = "white",
    hatch: str | None = None,
    gid: str | None = None,
    **kw: Any,
) -> Rectangle:
    """A block, slot or reservation, ``xywh = (x, y, width, height)``: its left ``fill`` share (0..1) in ``ink``.

    The rest is ``empty`` (a colour, ``hatch``-ed in the ink's colour; None: not drawn), then an
    outline (``ec``, ``lw``, ``gid``; returned) and ``text`` centred, black with a white halo (``kw``
    goes to ``ax.text``). The filled and empty parts carry the gids ``"used"`` and ``"empty"``.
    """
    x, y, w, h = xywh
    if fill > 0:
        ax.add_patch(Rectangle((x, y), w * fill, h, fc=ink.color, hatch=ink.hatch, ec=ink.text, lw=0, gid="used"))
    if fill < 1 and empty is not None:
        e = w * (1 - fill)
        ax.add_patch(Rectangle((x + w - e, y), e, h, fc=empty, hatch=hatch, ec=ink.color, lw=0, gid="empty"))
    outline = Rectangle((x, y), w, h, fill=False, ec=ec, lw=lw, gid=gid)
    ax.add_patch(outline)
    if text:
        kw = {"fontsize": SMALL + 1, "ha": "center", "va": "center", "path_effects": HALO, **kw}
        ax.text(x + w / 2, y + h / 2, text, **kw)
    return outline
