"""The course in Chinese: every markdown cell's translation beside it, and a test that sees drift.

``notebooks/zh/NN_name.md`` holds one block per markdown cell, keyed by the cell's id and the
fingerprint of the English it translates (see minipaged/course/translation.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from minipaged.__main__ import main
from minipaged.course.learner import make_learner_copy
from minipaged.course.translation import drift, format_block, read_translation, translate, translation_path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
HAN = re.compile(r"[\u4e00-\u9fff]")


def small_notebook(tmp_path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Blocks\n\nA block holds 16 tokens."),
        nbformat.v4.new_code_cell("x = 1"),
    ]
    nb.cells[0].id, nb.cells[1].id = "intro", "code-1"
    path = tmp_path / "notebooks" / "00_small.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path


def test_a_block_round_trips_and_an_edit_makes_it_stale(tmp_path):
    path = small_notebook(tmp_path)
    nb = nbformat.read(path, as_version=4)
    zh = translation_path(path, "zh")
    zh.parent.mkdir()
    zh.write_text(format_block("intro", nb.cells[0].source, "# 块\n\n一个块存 16 个词元。"), encoding="utf-8")
    assert drift(nb, read_translation(zh)) == {}
    assert translate(nb, path, "zh").cells[0].source == "# 块\n\n一个块存 16 个词元。"
    assert nb.cells[1].source == "x = 1"  # code is never translated

    edited = nbformat.read(path, as_version=4)
    edited.cells[0].source += " Its K and V are written once."
    assert drift(edited, read_translation(zh)) == {"intro": "stale: its English changed"}
    with pytest.raises(ValueError, match="intro \\(stale"):
        translate(edited, path, "zh")


def test_missing_unused_and_twice_translated_cells_are_named(tmp_path):
    path = small_notebook(tmp_path)
    nb = nbformat.read(path, as_version=4)
    zh = translation_path(path, "zh")
    zh.parent.mkdir()
    zh.write_text(format_block("gone", "old text", "旧的"), encoding="utf-8")
    assert drift(nb, read_translation(zh)) == {"intro": "missing", "gone": "unused: no markdown cell has this id"}
    zh.write_text(format_block("intro", nb.cells[0].source, "a") + format_block("intro", nb.cells[0].source, "b"))
    with pytest.raises(ValueError, match="translated twice"):
        read_translation(zh)
    zh.write_text("stray text\n" + format_block("intro", nb.cells[0].source, "a"))
    with pytest.raises(ValueError, match="before the first"):
        read_translation(zh)


def test_an_incomplete_translation_writes_no_copy(tmp_path, capsys):
    path = small_notebook(tmp_path)
    (tmp_path / "exercises").mkdir()
    with pytest.raises(ValueError, match="00_small.ipynb: intro \\(missing\\)"):
        make_learner_copy(tmp_path / "out", repo=tmp_path, lang="zh")
    assert not (tmp_path / "out").exists()
    assert path.exists()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem[:2] for p in NOTEBOOKS])
def test_every_markdown_cell_has_a_current_chinese_translation(notebook):
    nb = nbformat.read(notebook, as_version=4)
    translations = read_translation(translation_path(notebook, "zh"))
    assert drift(nb, translations) == {}, f"python scripts/translation.py {notebook.relative_to(ROOT)}"
    for cell_id, block in translations.items():
        assert HAN.search(block.text), f"{notebook.name} cell {cell_id}: no Chinese in its translation"


def test_the_chinese_copy_has_chinese_prose_and_the_same_code(tmp_path):
    main(["course", "--lang", "zh", str(tmp_path / "zh")])
    make_learner_copy(tmp_path / "en")
    for notebook in NOTEBOOKS:
        zh = nbformat.read(tmp_path / "zh" / "notebooks" / notebook.name, as_version=4).cells
        en = nbformat.read(tmp_path / "en" / "notebooks" / notebook.name, as_version=4).cells
        assert [c.cell_type for c in zh] == [c.cell_type for c in en]
        assert [c.source for c in zh if c.cell_type == "code"] == [c.source for c in en if c.cell_type == "code"]
        prose = [c.source for c in zh if c.cell_type == "markdown"]
        assert all(HAN.search(text) for text in prose), notebook.name
    assert "由 `python -m minipaged course --lang zh`" in (tmp_path / "zh" / "README.md").read_text(encoding="utf-8")
