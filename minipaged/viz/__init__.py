"""Pictures of KV memory: pure render functions (state -> matplotlib Figure) and widget helpers.

Importing this package applies the project's figure style (:mod:`.style`).
"""

from minipaged.viz.style import PALETTE, figure_png, new_figure, owner_color, save_figure

__all__ = ["PALETTE", "figure_png", "new_figure", "owner_color", "save_figure"]
