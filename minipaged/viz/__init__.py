"""Pictures of KV memory: pure render functions (state -> matplotlib Figure) and widget helpers.

Importing this package applies the project's figure style (:mod:`.style`); every colour comes
from :mod:`.palette`.
"""

from minipaged.viz.palette import PALETTE, owner_color
from minipaged.viz.style import figure_png, new_figure, save_figure

__all__ = ["PALETTE", "figure_png", "new_figure", "owner_color", "save_figure"]
