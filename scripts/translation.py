"""What a notebook's translation lacks, printed ready to translate.

    python scripts/translation.py notebooks/00_contiguous_baseline.ipynb [--lang zh]
    python scripts/translation.py notebooks/0*.ipynb --summary

For each markdown cell whose translation is missing or stale, prints the block's marker line (the
cell id and the fingerprint of its current English), the English, and the old translation if
there is one. Paste the marker into ``notebooks/zh/NN_name.md`` with the translation under it
(replacing a stale block's marker and text). Exit status: the number of cells still to translate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from minipaged.course.translation import drift, fingerprint, read_translation, translation_path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--lang", default="zh")
    parser.add_argument("--summary", action="store_true", help="one line per notebook: cells still to translate")
    args = parser.parse_args(argv)
    todo = 0
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        translations = read_translation(translation_path(path, args.lang))
        problems = drift(nb, translations)
        todo += len(problems)
        markdown = sum(c.cell_type == "markdown" for c in nb.cells)
        print(f"# {path.name}: {len(problems)} of {markdown} markdown cells to translate")
        if args.summary:
            continue
        for cell in nb.cells:
            why = problems.get(str(cell.id))
            if cell.cell_type != "markdown" or why is None:
                continue
            print(f"\n## {why}\n<!-- cell {cell.id} en {fingerprint(cell.source)} -->\n{cell.source}")
            if str(cell.id) in translations:
                print(f"\n### the old translation\n{translations[str(cell.id)].text}")
        for cell_id, why in problems.items():
            if why.startswith("unused"):
                print(f"\n## {cell_id}: {why}")
    return todo


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
