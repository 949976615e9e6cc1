"""The course in another language: each markdown cell's translation kept beside it, keyed by cell id.

The code of a notebook exists once. Its prose is translated cell by cell, in one Markdown file
per notebook, ``notebooks/zh/NN_name.md``, made of blocks like::

    <!-- cell 9f33fc08 en 3a41c07d52e6 -->
    ## 连续缓存

    每个序列预留 ``max_seq_len`` 个槽位 ...

The marker names the cell (its nbformat id) and a fingerprint of the English it translates
(the first 12 hex digits of the sha256 of the cell's source). When someone edits a cell's
English, its fingerprint no longer matches: :func:`drift` lists that cell, the drift test
fails, and ``python scripts/translation.py NOTEBOOK`` prints the English to translate again.

``python -m minipaged course --lang zh OUT`` writes a learner's copy whose markdown cells are
the translations; code cells, outputs and guesses are treated exactly as in the English copy.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from nbformat import NotebookNode

LANGUAGES = ("en", "zh")
MARKER = re.compile(r"^<!-- cell (?P<id>\S+) en (?P<en>[0-9a-f]{12}) -->$", re.MULTILINE)


class Translated(NamedTuple):
    """One markdown cell in another language: the fingerprint of the English it was made from."""

    en: str
    text: str


def fingerprint(source: str) -> str:
    """The first 12 hex digits of the sha256 of a cell's English source."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]


def translation_path(notebook: Path, lang: str) -> Path:
    """``notebooks/NN_name.ipynb`` -> ``notebooks/<lang>/NN_name.md``."""
    return notebook.parent / lang / f"{notebook.stem}.md"


def read_translation(path: Path) -> dict[str, Translated]:
    """The blocks of a translation file, by cell id (a missing file has none)."""
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    marks = list(MARKER.finditer(text))
    if text[: marks[0].start() if marks else len(text)].strip():
        raise ValueError(f"{path}: text before the first '<!-- cell ID en HASH -->' marker")
    cells: dict[str, Translated] = {}
    for mark, after in zip(marks, [*marks[1:], None]):
        cell_id = mark["id"]
        if cell_id in cells:
            raise ValueError(f"{path}: cell {cell_id} is translated twice")
        body = text[mark.end() : after.start() if after else len(text)]
        cells[cell_id] = Translated(mark["en"], body.strip("\n"))
    return cells


def format_block(cell_id: str, english: str, text: str) -> str:
    """One block of a translation file, as :func:`read_translation` reads it."""
    return f"<!-- cell {cell_id} en {fingerprint(english)} -->\n{text.strip()}\n"


def drift(nb: NotebookNode, translations: dict[str, Translated]) -> dict[str, str]:
    """Why each markdown cell without a current translation lacks one: ``{cell id: reason}``.

    A cell is missing (no block), stale (its English changed since the block was written), and a
    block whose cell is gone is unused. An empty result means the translation is complete.
    """
    problems: dict[str, str] = {}
    markdown = {str(c.id): c.source for c in nb.cells if c.cell_type == "markdown"}
    for cell_id, english in markdown.items():
        if cell_id not in translations:
            problems[cell_id] = "missing"
        elif translations[cell_id].en != fingerprint(english):
            problems[cell_id] = "stale: its English changed"
        elif not translations[cell_id].text.strip():
            problems[cell_id] = "empty"
    for cell_id in translations.keys() - markdown.keys():
        problems[cell_id] = "unused: no markdown cell has this id"
    return problems


def translate(nb: NotebookNode, path: Path, lang: str) -> NotebookNode:
    """``nb`` (read from ``path``) with its markdown cells in ``lang``; refuses an incomplete translation."""
    if lang == "en":
        return nb
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}: choose one of {', '.join(LANGUAGES)}")
    source = translation_path(path, lang)
    translations = read_translation(source)
    problems = drift(nb, translations)
    if problems:
        listed = ", ".join(f"{cell_id} ({why})" for cell_id, why in sorted(problems.items()))
        raise ValueError(
            f"{source} does not cover {path.name}: {listed}. "
            f"`python scripts/translation.py {path}` prints the English to translate"
        )
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = translations[str(cell.id)].text
    return nb
