"""Slides from the notebooks: ``python -m minipaged slides OUT_DIR``.

Every notebook's cells carry nbconvert's ``slideshow`` metadata (``slide_type``: ``slide`` for
a section, ``subslide`` for a question or an explanation, ``-`` to stay on the slide above,
``skip`` for setup and guess cells). nbconvert's reveal.js exporter turns each notebook, with
its saved outputs, into one HTML deck: ``OUT_DIR/NN_name.slides.html``, and ``index.html``
lists them.

The decks open offline, from the file system: nbconvert's default template loads reveal.js,
require.js, jQuery, Mermaid and MathJax from CDNs, so the template here
(``templates/minipaged_slides``) loads only reveal.js and MathJax, with plain ``<script>`` tags,
from folders next to the decks: ``reveal.js/`` (reveal.js 4.6, MIT, shipped in this package:
the files its ``dist/`` and ``plugin/notes/`` hold, white theme, woff fonts) and ``mathjax/``
(MathJax 2.7, from the ``jupyter-server-mathjax`` package). Widgets show the picture that
``scripts/execute_notebooks.py`` saved beside them.

Keys in a deck: arrows (right: next section, down: next slide of a section), ``s`` the speaker
view, ``f`` full screen, ``Esc`` an overview.
"""

from __future__ import annotations

import html
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nbformat import NotebookNode

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REVEAL = HERE / "reveal.js"
TEMPLATES = HERE / "templates"
TEMPLATE = "minipaged_slides"
MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def mathjax_folder() -> Path:
    """MathJax 2.7's files, as the jupyter-server-mathjax package ships them."""
    try:
        import jupyter_server_mathjax
    except ImportError as exc:
        msg = 'slides need jupyter-server-mathjax: pip install -e ".[notebooks]"'
        raise ModuleNotFoundError(msg, name=exc.name) from exc
    return Path(jupyter_server_mathjax.__file__).resolve().parent / "static"


def deck_notebook(path: Path) -> NotebookNode:
    """The notebook as a deck shows it: widgets replaced by the pictures saved beside them."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data and "image/png" in data:
                del data[WIDGET_VIEW]
                data.pop("text/plain", None)  # "VBox(children=...)"
    return nb


def export_deck(path: Path) -> str:
    """One notebook's reveal.js deck, as HTML that loads ``reveal.js/`` and ``mathjax/`` from beside it."""
    from nbconvert import SlidesExporter

    exporter = SlidesExporter(
        extra_template_basedirs=[str(TEMPLATES)],
        template_name=TEMPLATE,
        reveal_url_prefix="reveal.js",
        reveal_theme="white",
        reveal_number="c/t",
    )
    resources = {"minipaged_mathjax_url": f"mathjax/MathJax.js?config={MATHJAX_CONFIG}"}
    body, _ = exporter.from_notebook_node(deck_notebook(path), resources=resources)
    return body


KEYS = "Arrows move (right: next section, down: next slide of a section); s: speaker view; Esc: overview."


def index_page(
    decks: list[Path], heading: str = "minipaged: one deck per notebook", labels: list[str] | None = None,
    keys: str = KEYS,
) -> str:  # fmt: skip
    """A page linking every deck (``labels``: the link texts, else each deck's file name without suffixes)."""
    names = labels or [d.name.split(".")[0] for d in decks]
    items = "\n".join(f'<li><a href="{html.escape(d.name)}">{html.escape(n)}</a></li>' for d, n in zip(decks, names))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>minipaged slides</title></head>\n'
        f"<body>\n<h1>{html.escape(heading)}</h1>\n<ul>\n{items}\n</ul>\n<p>{html.escape(keys)}</p>\n"
        "</body>\n</html>\n"
    )


def copy_assets(out_dir: Path, mathjax: bool = True) -> None:
    """Copy reveal.js (and MathJax, unless ``mathjax=False``) into ``out_dir``, where the decks load them from."""
    assets = [(REVEAL, "reveal.js")] + ([(mathjax_folder(), "mathjax")] if mathjax else [])
    for source, name in assets:
        shutil.copytree(source, out_dir / name, dirs_exist_ok=True)


def build_slides(out_dir: Path, notebooks: list[Path] | None = None) -> list[Path]:
    """Write one deck per notebook into ``out_dir``, with reveal.js and MathJax beside them; returns the decks."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    copy_assets(out_dir)
    decks = []
    for path in notebooks or sorted((REPO / "notebooks").glob("[0-9]*.ipynb")):
        deck = out_dir / f"{path.stem}.slides.html"
        deck.write_text(export_deck(path), encoding="utf-8")
        decks.append(deck)
    (out_dir / "index.html").write_text(index_page(decks), encoding="utf-8")
    return decks
