"""Predict, then see: compare a learner's guess with what a cell computed.

A notebook's question is a markdown cell starting **Predict:**; the next cell holds the guess,
``my_guess = None  # your guess: ...``; the cell after it computes the answer and ends with
``reveal(my_guess, answer)``. With no guess yet it prints the same line every time (the notebook
tests compare that output), so the guess must be written before the answer is looked at. What
the cell prints on the way to its answer waits too: ``with until_guessed(my_guess):`` holds it
back, and shows it only once a guess is set.

Guesses are compared loosely, as a teacher would: numbers within ``tolerance``, words ignoring
case and surrounding spaces, lists and tuples item by item (a tuple answer may have one
tolerance per item).
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from numbers import Number, Real

NO_GUESS = "make a guess first: write it in my_guess in the cell above, run that cell, then this one"


def matches(guess: object, answer: object, tolerance: object = 0.0) -> bool:
    """Whether ``guess`` is ``answer``: numbers within ``tolerance``, words ignoring case, sequences item by item.

    ``tolerance`` is a number, or (for a sequence answer) one tolerance per item. A number and a
    word compare as text, so ``"nan"`` matches ``float("nan")``.
    """
    if isinstance(guess, (list, tuple)) and isinstance(answer, (list, tuple)):
        tolerances = tolerance if isinstance(tolerance, (list, tuple)) else [tolerance] * len(answer)
        return len(guess) == len(answer) and all(matches(g, a, t) for g, a, t in zip(guess, answer, tolerances))
    if isinstance(guess, bool) or isinstance(answer, bool):
        return type(guess) is type(answer) and guess == answer
    if isinstance(guess, Real) and isinstance(answer, Real) and isinstance(tolerance, Real):
        return abs(float(guess) - float(answer)) <= float(tolerance)
    if isinstance(guess, (str, Number)) and isinstance(answer, (str, Number)):
        return str(guess).strip().lower() == str(answer).strip().lower()
    return guess == answer


def verdict(guess: object, answer: object, tolerance: object = 0.0) -> str:
    """The line :func:`reveal` prints."""
    if guess is None:
        return NO_GUESS
    outcome = "right." if matches(guess, answer, tolerance) else "not quite: open the Why below."
    return f"you predicted {guess}; it is {answer}: {outcome}"


def reveal(guess: object, answer: object, tolerance: object = 0.0) -> None:
    """Print "you predicted X; it is Y" (or ask for a guess first when ``guess`` is None)."""
    print(verdict(guess, answer, tolerance))


@contextlib.contextmanager
def until_guessed(guess: object) -> Iterator[None]:
    """Hold back what the block prints while ``guess`` is None (it would give the answer away).

    With a guess, the printed lines appear when the block ends, before :func:`reveal`'s line; an
    error shows them too, then the traceback. Pictures shown with ``display`` are not held back.
    """
    if guess is not None:
        yield
        return
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held):
            yield
    except BaseException:
        sys.stdout.write(held.getvalue())
        raise
