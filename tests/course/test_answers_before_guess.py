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
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import nbformat
import pytest

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


def shown(cell) -> list[str]:
    """What a reader sees of a cell: markdown, a code cell's comments and its committed outputs."""
    if cell.cell_type == "markdown":
        return [cell.source]
    if cell.cell_type != "code":
        return []
    texts = ["\n".join(line.partition("#")[2] for line in cell.source.splitlines() if "#" in line)]
    for out in cell.get("outputs", []):
        if "text" in out:
            texts.append(out["text"])
        for kind in ("text/plain", "text/markdown", "text/html"):
            if kind in out.get("data", {}):
                texts.append(out["data"][kind])
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
        for text in shown(cell):
            for phrase in entry.get("allow", []):
                text = text.replace(phrase, "")
            found += [f"cell {i}: {tell!r}" for tell in sorted(tells) if leaks(text, tell)]
    assert not found, f"{name}, the answer to the guess in cell {guess} ({entry['answer']}) shows above it: {found}"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("0*.ipynb")), ids=lambda p: p.name[:2])
def test_every_guess_has_its_answer(path):
    nb = nbformat.read(path, as_version=4)
    guesses = [c.get("id") for c in nb.cells if c.cell_type == "code" and GUESS.search(c.source)]
    assert guesses and sorted(guesses) == sorted(ANSWERS.get(path.name, {})), (
        f"{path.name}: guess cells and answers.json differ: re-run scripts/course_answers.py"
    )
