"""The committed notebooks follow the course's conventions: predict, then see; slides; a Chinese companion.

- every **Predict:** question is followed by a guess cell, ``my_guess = None  # your guess: ...``,
  and a code cell after it (before the next markdown cell) compares it: ``reveal(my_guess, ...)``;
- no guess is filled in, and each guess cell's example ("e.g. ...") is a value a learner can paste;
- every cell has nbconvert's ``slideshow`` metadata, and each notebook's first cell links to its
  section of ``docs/zh/notebooks.md``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

from minipaged.course.learner import is_guess_cell

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9]*.ipynb"))
SLIDE_TYPES = {"slide", "subslide", "fragment", "-", "skip", "notes"}


def cells(path: Path):
    return nbformat.read(path, as_version=4).cells


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_prediction_has_a_blank_guess_and_a_comparison(path):
    nb = cells(path)
    questions = [i for i, c in enumerate(nb) if c.cell_type == "markdown" and "**Predict:**" in c.source]
    guesses = [i for i, c in enumerate(nb) if is_guess_cell(c)]
    assert len(questions) == len(guesses) >= 4, (questions, guesses)
    for q, g in zip(questions, guesses):
        assert q < g and all(c.cell_type == "code" for c in nb[q + 1 : g + 1]), f"cell {g}: guess not right after {q}"
        assert nb[g].source.startswith("my_guess = None  # your guess: "), nb[g].source
        assert nb[g].get("outputs") == [], f"cell {g}: a guess cell prints nothing"
        end = next((j for j in range(g + 1, len(nb)) if nb[j].cell_type == "markdown"), len(nb))
        assert any("reveal(my_guess" in c.source for c in nb[g + 1 : end]), f"no cell after guess {g} compares it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_guess_examples_are_python_values(path):
    """A guess cell's comment shows the form of a guess ("e.g. (3, True)"): it must be a Python value."""
    nb = cells(path)
    for i, cell in enumerate(nb):
        if not is_guess_cell(cell) or "e.g. " not in cell.source:
            continue
        example = cell.source.split("e.g. ", 1)[1].strip()
        try:
            ast.literal_eval(example)
        except (ValueError, SyntaxError):
            pytest.fail(f"cell {i}: the example {example!r} is not a Python value a learner could paste")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cells_are_tagged_for_slides(path):
    nb = cells(path)
    kinds = [c.metadata.get("slideshow", {}).get("slide_type") for c in nb]
    assert all(k in SLIDE_TYPES for k in kinds), [i for i, k in enumerate(kinds) if k not in SLIDE_TYPES]
    assert kinds[0] == "slide" and kinds.count("slide") >= 5
    assert all(kinds[i] == "skip" for i, c in enumerate(nb) if is_guess_cell(c))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_cell_links_to_the_chinese_companion(path):
    number = path.name[:2]
    assert f"../docs/zh/notebooks.md#nb{number}" in cells(path)[0].source
    assert f'<a id="nb{number}"></a>' in (path.parents[1] / "docs" / "zh" / "notebooks.md").read_text(encoding="utf-8")
