"""Pictures of KV memory: pure render functions (state -> matplotlib Figure), widget helpers, animations.

Importing this package applies the project's figure style (:mod:`.style`); every colour comes
from :mod:`.palette`.
"""

from minipaged.viz.palette import owner_color
from minipaged.viz.style import figure_png, new_figure, save_figure

__all__ = ["figure_png", "new_figure", "owner_color", "save_figure"]
