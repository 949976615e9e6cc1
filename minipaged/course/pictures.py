"""Pictures that say what they show: a notebook's figures carry their text inside the PNG.

A saved picture can give a prediction's answer away as surely as a printed line (a title such as
"8 reservations"). Inside a notebook, importing :mod:`minipaged.course` registers
:func:`inline_png` for matplotlib figures: each figure's PNG gets an ``iTXt`` chunk with every
text drawn in it (:func:`minipaged.viz.style.figure_text`), and widget pictures get the same from
:func:`minipaged.viz.style.figure_png`. The course's tests read it back
(:func:`minipaged.viz.style.png_text`) to check that no picture above a guess shows its answer.
The picture itself is unchanged.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from minipaged.viz.style import figure_text, png_with_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def inline_png(fig: Figure, **kwargs: Any) -> str:
    """The notebook's PNG of ``fig`` (as the inline backend draws it: a tight bounding box), with its text."""
    from IPython.core.pylabtools import print_figure

    png = print_figure(fig, "png", **{"bbox_inches": "tight", **kwargs})
    return base64.b64encode(png_with_text(png, figure_text(fig))).decode()


def install() -> bool:
    """Register :func:`inline_png` for matplotlib figures in the running IPython; False outside one."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    from matplotlib.figure import Figure

    shell.display_formatter.formatters["image/png"].for_type(Figure, inline_png)
    return True
