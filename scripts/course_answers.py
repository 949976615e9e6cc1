"""Write tests/course/answers.json: each prediction's answer, as its reveal cell computes it.

    python scripts/course_answers.py [notebooks/NN_*.ipynb ...]     # default: notebooks/0*.ipynb

Runs each notebook in a fresh kernel with ``reveal`` replaced by one that prints its answer, and
keys the answers by notebook and guess cell id (the ``my_guess = None`` cell before the reveal).
An entry's ``allow``, ``tells`` and ``volatile`` fields (tests/course/test_answers_before_guess.py)
are kept; only ``answer`` is rewritten.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = ROOT / "tests" / "course" / "answers.json"
MARK = "@@answer@@"
PATCH = f"""import minipaged.course as _course
def _reveal(guess, answer, tolerance=0.0):
    print({MARK!r} + repr(answer))
_course.reveal = _reveal
"""


def answers_of(path: Path) -> dict[str, str]:
    nb = nbformat.read(path, as_version=4)
    cells = list(nb.cells)
    nb.cells.insert(0, nbformat.v4.new_code_cell(PATCH))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    found = {}
    for i, cell in enumerate(nb.cells[1:]):
        for out in cell.get("outputs", []):
            for line in out.get("text", "").splitlines():
                if line.startswith(MARK):
                    guess = max(j for j in range(i) if re.search(r"^my_guess = None", cells[j].source, re.M))
                    found[cells[guess]["id"]] = line[len(MARK) :]
    return found


def main(paths: list[str]) -> None:
    data = json.loads(ANSWERS.read_text()) if ANSWERS.exists() else {}
    for path in [Path(p) for p in paths] or sorted((ROOT / "notebooks").glob("0*.ipynb")):
        old = data.get(path.name, {})
        data[path.name] = {gid: {**old.get(gid, {}), "answer": answer} for gid, answer in answers_of(path).items()}
        print(path.name, len(data[path.name]), "answers")
    ANSWERS.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
