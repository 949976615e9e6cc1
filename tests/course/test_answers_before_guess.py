"""Nothing of a prediction's answer is shown above its guess.

A notebook asks a learner to predict (a ``my_guess = None`` cell), then a cell computes the answer
and ``reveal`` prints it. ``answers.json`` holds each answer, keyed by notebook and guess cell id,
as the reveal cell computes it (``python scripts/course_answers.py`` writes them from a run of the
notebooks). For every prediction, nothing above the guess — markdown (prose, headings), code
comments, committed outputs, and the guess cell's own example — nor the committed outputs down
to the reveal (its cell prints only the ask-for-a-guess line until a guess is set) may contain
the answer:

- its literal value, and each list or tuple inside it (``[7, 3]``), as written by ``repr``;
- each number in it of two or more digits, or with a fraction (``66``, ``15.6``), standing alone;
- the entry's ``tells``: phrases that give away a small number or a word (``room for 8``), which
  would otherwise match everywhere.

``allow`` lists phrases above the guess that hold the same number for another reason (the
embedded model's 32 dimensions per head is not the oracle's 32% of empty slots): they are taken
out of the text before it is searched.

Saved pictures are read too: a figure drawn in a notebook (and every widget picture) carries the
text drawn in it inside its PNG (:mod:`minipaged.course.pictures`), titles, labels, legends and
tick labels, and that text is searched like the rest. A saved picture above a guess whose text
cannot be read fails, since nothing would then say what it shows. The strings a code cell writes
(a title, a label) are searched as well, and the cells between a guess and its reveal may show
nothing at all until a guess is set.
"""

from __future__ import annotations

import ast
import base64
import json
import math
import re
from pathlib import Path

import nbformat
import pytest

from minipaged.viz.style import png_text

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
ANSWERS = json.loads((Path(__file__).parent / "answers.json").read_text())
GUESS = re.compile(r"^my_guess = None\b", re.M)


def parse(text: str) -> object:
    """The answer as the reveal cell computed it (``nan`` included)."""
    return eval(text, {"__builtins__": {}}, {"nan": math.nan, "inf": math.inf})  # a literal, written by repr


def literals(value: object) -> set[str]:
    """The strings that would give ``value`` away."""
    found: set[str] = set()
    if isinstance(value, (list, tuple)):
        found.add(repr(value))
        for item in value:
            found |= literals(item)
    elif isinstance(value, bool) or isinstance(value, str):
        pass  # True/False and words are everywhere in prose: they go in "tells"
    elif isinstance(value, float) and math.isnan(value):
        pass
    elif isinstance(value, (int, float)) and (abs(value) >= 10 or value != int(value)):
        found.add(repr(value))
    return found


# Notebooks whose committed pictures were saved before pictures carried their text: their pictures
# are not read (re-executing the notebook with scripts/execute_notebooks.py takes it off this list).
PICTURES_WITHOUT_TEXT: set[str] = set()
UNREADABLE = "<a saved picture without its text>"


def code_strings(source: str) -> list[str]:
    """The string constants a code cell writes (titles, labels), f-strings' fixed parts included."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell magic
        return []
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def picture_texts(cell) -> list[str]:
    """The text inside each saved picture of a cell's outputs (``UNREADABLE`` for a picture without any)."""
    texts = []
    for out in cell.get("outputs", []):
        png = out.get("data", {}).get("image/png")
        if png is not None:
            text = png_text(base64.b64decode(png))
            texts.append(UNREADABLE if text is None else text)
    return texts


def shown(cell, pictures: bool = True) -> list[str]:
    """What a reader sees of a cell: markdown; a code cell's comments, strings and committed outputs,
    the text inside its saved pictures included."""
    if cell.cell_type == "markdown":
        return [cell.source]
    if cell.cell_type != "code":
        return []
    texts = ["\n".join(line.partition("#")[2] for line in cell.source.splitlines() if "#" in line)]
    texts += code_strings(cell.source)
    for out in cell.get("outputs", []):
        if "text" in out:
            texts.append(out["text"])
        for kind in ("text/plain", "text/markdown", "text/html"):
            if kind in out.get("data", {}):
                texts.append(out["data"][kind])
    if pictures:
        texts += picture_texts(cell)
    return texts


def leaks(text: str, tell: str) -> bool:
    if re.fullmatch(r"-?\d+(\.\d+)?", tell):  # a number standing alone: not 660, 6.6, 1.66 or a hash's e80c
        return re.search(rf"(?<![\w.]){re.escape(tell)}(?!(?!x\b)\w|\.\d)", text) is not None
    return tell.lower() in text.lower()


def predictions():
    for name, entries in ANSWERS.items():
        for guess_id, entry in entries.items():
            yield pytest.param(name, guess_id, entry, id=f"{name[:2]}-{guess_id}")


@pytest.mark.parametrize("name,guess_id,entry", predictions())
def test_nothing_of_the_answer_above_its_guess(name, guess_id, entry):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    ids = [c.get("id") for c in nb.cells]
    assert guess_id in ids, f"{name}: no cell {guess_id}: re-run scripts/course_answers.py"
    guess = ids.index(guess_id)
    # ... down to the cell that reveals it: what runs before the reveal must print nothing of it
    last = next(i for i in range(guess + 1, len(nb.cells)) if "reveal(my_guess" in nb.cells[i].source)
    tells = set(entry.get("tells", []))
    if not entry.get("volatile"):  # a timing: its digits change from run to run
        tells |= literals(parse(entry["answer"]))
    found = []
    for i, cell in enumerate(nb.cells[: last + 1]):
        for text in shown(cell, pictures=name not in PICTURES_WITHOUT_TEXT):
            if text == UNREADABLE:
                found.append(
                    f"cell {i}: a saved picture whose text cannot be read (draw it after importing minipaged.course)"
                )
                continue
            for phrase in entry.get("allow", []):
                text = text.replace(phrase, "")
            found += [f"cell {i}: {tell!r}" for tell in sorted(tells) if leaks(text, tell)]
    assert not found, f"{name}, the answer to the guess in cell {guess} ({entry['answer']}) shows above it: {found}"


@pytest.mark.parametrize("name,guess_id,entry", predictions())
def test_nothing_shows_between_a_guess_and_its_reveal(name, guess_id, entry):
    """A cell run after the guess and before the reveal prints nothing and draws nothing while the guess is None."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    guess = [c.get("id") for c in nb.cells].index(guess_id)
    last = next(i for i in range(guess + 1, len(nb.cells)) if "reveal(my_guess" in nb.cells[i].source)
    found = [
        f"cell {i}" for i in range(guess + 1, last) if nb.cells[i].cell_type == "code" and nb.cells[i].get("outputs")
    ]
    assert not found, f"{name}: {found} show something between the guess in cell {guess} and its reveal: " + (
        "hold it back with `with until_guessed(my_guess):`"
    )


def test_pictures_carry_their_text():
    """The reading above works: a figure's PNG as a notebook saves it holds the figure's text, tick labels included."""
    from minipaged.course.pictures import inline_png
    from minipaged.viz.style import figure_png, new_figure

    fig, ax = new_figure(4, 3)
    ax.set_title("C holds 40 tokens")
    ax.plot([0, 1], [0, 33])
    for png in (base64.b64decode(inline_png(fig)), figure_png(fig)):
        text = png_text(png)
        assert text is not None and "C holds 40 tokens" in text and "30" in text.split("\n"), text
        assert leaks(text, "40") and not leaks(text, "33")
    assert picture_texts({"outputs": [{"data": {"image/png": base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()}}]}) == [
        UNREADABLE
    ]
    assert code_strings('draw(title=f"the running example: A = {A}")\nx = 1  # no') == ["the running example: A = "]


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("0*.ipynb")), ids=lambda p: p.name[:2])
def test_every_guess_has_its_answer(path):
    nb = nbformat.read(path, as_version=4)
    guesses = [c.get("id") for c in nb.cells if c.cell_type == "code" and GUESS.search(c.source)]
    assert guesses and sorted(guesses) == sorted(ANSWERS.get(path.name, {})), (
        f"{path.name}: guess cells and answers.json differ: re-run scripts/course_answers.py"
    )
