"""Learner pages speak of the subject: no wording from how the project was run.

What a page measured is said as a measurement (what, on what hardware, against the paper), not
as a target met or missed, a machine shared with other work, or a session's or an issue's
business. Searched: README*.md, docs/ (Markdown, both languages), the notebooks' markdown cells
and committed text outputs.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = re.compile(
    r"\btargets?\b|\bmissed\b|shared with (other|a training)|\bbusy with other work\b"
    r"|\bsession\b|\bthe issue\b|\bissue #?\d+|\bworkshop\b|\bour CI\b"
    r"|目标\s*[\d>]|未达到|没有达到|训练任务",
    re.IGNORECASE,
)
# Legitimate uses: Triton's compile target, a class name.
ALLOWED = re.compile(r"target=GPUTarget|ChatSession")


def pages() -> list[Path]:
    # The paper's committed results too: their notes are printed by `python -m minipaged paper`.
    return (
        sorted(ROOT.glob("README*.md"))
        + sorted((ROOT / "docs").rglob("*.md"))
        + sorted(ROOT.glob("notebooks/*.md"))
        + sorted((ROOT / "docs" / "paper").glob("*.json"))
    )


def notebook_texts(path: Path) -> list[tuple[str, str]]:
    nb = nbformat.read(path, as_version=4)
    texts = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            texts.append((f"cell {i}", cell.source))
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain") or ""
            texts.append((f"cell {i} output", "".join(text)))
    return texts


def offending(text: str) -> list[str]:
    text = ALLOWED.sub("", text)
    return [text[max(0, m.start() - 40) : m.end() + 20].replace("\n", " ") for m in FORBIDDEN.finditer(text)]


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_speaks_of_the_subject(path):
    found = offending(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)}: {found}"


@pytest.mark.parametrize("path", sorted(ROOT.glob("notebooks/0*.ipynb")), ids=lambda p: p.name[:2])
def test_notebook_speaks_of_the_subject(path):
    found = [f"{where}: {hit}" for where, text in notebook_texts(path) for hit in offending(text)]
    assert not found, f"{path.name}: {found}"
