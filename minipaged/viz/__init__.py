"""Pictures of KV memory: pure render functions (state -> matplotlib Figure), widget helpers, animations.

What they draw an engine step from is a :class:`StepSnapshot`, which :func:`step_snapshot`
records while it runs the step (:mod:`.snapshot`).

Importing this package applies the project's figure style (:mod:`.style`); every colour comes
from :mod:`.palette`.
"""

from minipaged.viz.palette import owner_color
from minipaged.viz.snapshot import StepSnapshot, step_snapshot
from minipaged.viz.style import figure_png, new_figure, save_figure

__all__ = ["StepSnapshot", "figure_png", "new_figure", "owner_color", "save_figure", "step_snapshot"]
