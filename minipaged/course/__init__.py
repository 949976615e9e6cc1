"""The course around the package: predict-then-see, a learner's copy, slides.

The notebooks ask a learner to **predict** a number before a cell computes it. The guess goes in
a cell of its own (``my_guess = None  # your guess: ...``) and the computing cell ends with
:func:`~minipaged.course.predict.reveal`, which prints "you predicted X; it is Y". The folded
*Why* below says why.

Two commands build what a learner and a teacher take away, from the notebooks as committed
(executed, outputs kept, so that they read well on the web):

    python -m minipaged course my-course/    # notebooks/ and exercises/, no outputs, guesses blank
    python -m minipaged slides my-slides/    # one reveal.js deck per notebook; opens offline

:mod:`~minipaged.course.learner` makes the learner's copy (outputs stripped by nbstripout, the
reference solutions left behind); :mod:`~minipaged.course.slides` exports the cells tagged with
``slideshow`` metadata through nbconvert's reveal.js exporter, with reveal.js and MathJax copied
next to the decks so that nothing is fetched from the network.

This is the top layer: the core never imports it.
"""

from __future__ import annotations

from minipaged.course import pictures
from minipaged.course.predict import reveal, until_guessed

__all__ = ["reveal", "until_guessed"]

pictures.install()  # in a notebook, every figure's PNG carries the text drawn in it
