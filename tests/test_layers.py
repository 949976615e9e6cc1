"""The package's shape, read from the code: module sizes, and the import picture of the docs.

Which package may import which is import-linter's to check: the contracts in pyproject.toml,
run by ``lint-imports`` (.ci/run runs it before the tests). These tests keep what it does not:
no module over 400 lines, and docs/figures/import_graph.{txt,svg} drawn from today's imports
by scripts/import_graph.py.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
MAX_LINES = 400
REFRESH = "run python scripts/import_graph.py and commit docs/figures/import_graph.*"


def _load_script():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


graph = _load_script()


def test_no_module_is_over_400_lines():
    counts = {
        p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in (ROOT / "minipaged").rglob("*.py")
    }
    assert len(counts) > 40
    long = {path: n for path, n in counts.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by idea): {long}"


def _drawn(svg: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The node names and the edges of a Graphviz SVG (their ``<title>``), row labels left out."""
    ns = "{http://www.w3.org/2000/svg}"
    nodes, edges = set(), set()
    for g in ET.fromstring(svg).iter(f"{ns}g"):
        title = g.findtext(f"{ns}title", "")
        if " " in title:  # a row label ("layer 1") or the links between them
            continue
        if g.get("class") == "node":
            nodes.add(title)
        elif g.get("class") == "edge":
            a, b = title.split("->")
            edges.add((a, b))
    return nodes, edges


def test_import_graph_text_is_up_to_date():
    nodes, edges = graph.read_graph()
    assert ("engine", "kv") in edges and ("kv", "utils") in edges  # what is known to be there
    committed = (FIGURES / "import_graph.txt").read_text(encoding="utf-8")
    assert committed == graph.graph_text(nodes, edges), f"docs/figures/import_graph.txt is stale: {REFRESH}"


def test_import_graph_picture_is_up_to_date():
    nodes, edges = graph.read_graph()
    drawn_nodes, drawn_edges = _drawn((FIGURES / "import_graph.svg").read_text(encoding="utf-8"))
    assert (drawn_nodes, drawn_edges) == (set(nodes), edges), f"docs/figures/import_graph.svg is stale: {REFRESH}"


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    """A made-up package whose kv/ imports upward in the ways grimp must see."""
    files = {
        "__init__.py": "from toypkg.engine.llm import LLM\n",
        "utils.py": "",
        "engine/__init__.py": "",
        "engine/llm.py": "from toypkg.kv import pool\n\nclass LLM: ...\n",
        "viz/__init__.py": "",
        "viz/draw.py": "",
        "kv/__init__.py": "",
        "kv/pool.py": textwrap.dedent("""\
            from typing import TYPE_CHECKING
            from toypkg import utils
            if TYPE_CHECKING:
                from toypkg.viz import draw

            def grow():
                from ..engine import llm
            """),
    }
    for name, text in files.items():
        path = tmp_path / "toypkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "toypkg"
    for name in [m for m in sys.modules if m == "toypkg" or m.startswith("toypkg.")]:
        del sys.modules[name]


def test_the_graph_sees_every_kind_of_import(toy_package):
    nodes, edges = graph.read_graph(toy_package)
    assert nodes == {"__init__": [], "engine": ["llm"], "kv": ["pool"], "utils": [], "viz": ["draw"]}
    assert edges == {
        ("__init__", "engine"),
        ("engine", "kv"),
        ("kv", "utils"),
        ("kv", "viz"),  # under TYPE_CHECKING
        ("kv", "engine"),  # inside a function, two dots up
    }


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)")
def test_the_picture_draws_every_edge_in_the_contracts_rows(toy_package):
    nodes, edges = graph.read_graph(toy_package)
    rows = [["viz"], ["engine"], ["kv"], ["utils"], ["absent"]]
    svg = graph.draw(nodes, edges, rows).pipe(format="svg", encoding="utf-8")
    assert _drawn(svg) == (set(nodes), edges)
    assert len(re.findall(r"<title>layer \d+</title>", svg)) == 4  # a label per row that has a node
