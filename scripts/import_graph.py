"""The imports between minipaged's packages, read by grimp and drawn by Graphviz.

    python scripts/import_graph.py    # rewrite docs/figures/import_graph.{txt,svg,png}

grimp (the import graph behind import-linter) reads every import in ``minipaged/`` without
running it: at module level, inside functions and under ``if TYPE_CHECKING:``. It does not see
a module named in a string for :mod:`importlib`. Each sub-package (``kv/``, ``engine/``, ...) is
squashed into one node; a top-level module (``utils.py``) is a node of its own, and so is the
package's ``__init__.py`` (the public API). The rows are the layers of the ``layers`` contract
in pyproject.toml, top to bottom, as ``lint-imports`` checks them.

The text file lists the nodes and the edges the picture is drawn from; tests/test_layers.py
checks that both files still match the code. Rendering needs Graphviz's ``dot`` (Debian:
``apt-get install graphviz``); reading the graph does not.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "minipaged"
FIGURES = ROOT / "docs" / "figures"
API = "__init__"  # the node of minipaged/__init__.py
NODES_HEADER = "# nodes: a sub-package and its modules, or a top-level module"
EDGES_HEADER = "# imports: importer -> imported"
# A colour per row, for the row's nodes and the arrows that leave them (Okabe-Ito, colour-blind safe).
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999933", "#882255", "#44AA99"]


def read_graph(package: str = PACKAGE) -> tuple[dict[str, list[str]], set[tuple[str, str]]]:
    """(node -> the modules squashed into it, the edges between nodes), from the code on sys.path."""
    import grimp

    graph = grimp.build_graph(package, cache_dir=None)
    nodes: dict[str, list[str]] = {API: []}
    for child in sorted(graph.find_children(package)):
        name = child.rpartition(".")[2]
        nodes[name] = sorted(m.rpartition(".")[2] for m in graph.find_descendants(child) if m.count(".") == 2)
        if nodes[name]:
            graph.squash_module(child)

    def node(module: str) -> str:
        return API if module == package else module.split(".")[1]

    edges = {
        (node(importer), node(imported))
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if node(importer) != node(imported)
    }
    return nodes, edges


def graph_text(nodes: dict[str, list[str]], edges: set[tuple[str, str]]) -> str:
    """What the picture shows, one node or edge a line."""
    lines = [
        "# The imports between minipaged's packages, read by grimp: written by scripts/import_graph.py.",
        "",
        NODES_HEADER,
        *[f"{name}: {' '.join(modules)}".rstrip() for name, modules in sorted(nodes.items())],
        "",
        EDGES_HEADER,
        *[f"{a} -> {b}" for a, b in sorted(edges)],
    ]
    return "\n".join(lines) + "\n"


def layers(pyproject: Path = ROOT / "pyproject.toml") -> list[list[str]]:
    """The rows of import-linter's layers contract, top to bottom, optional ones (in parentheses) included."""
    from importlinter.api import read_configuration

    contracts = read_configuration(str(pyproject))["contracts_options"]
    (contract,) = [c for c in contracts if c["type"] == "layers"]
    return [[name.strip().strip("()") for name in re.split(r"[|:]", row)] for row in contract["layers"]]


def draw(nodes: dict[str, list[str]], edges: set[tuple[str, str]], rows: list[list[str]]):
    """A ``graphviz.Digraph``: one row per layer, an arrow from each importer to what it imports."""
    import graphviz

    g = graphviz.Digraph("minipaged imports", graph_attr={"rankdir": "TB", "nodesep": "0.3", "ranksep": "0.45"})
    g.attr(
        label="The imports between minipaged's packages, read from the code by grimp, drawn by Graphviz.\n"
        "An arrow goes from the importer to what it imports. Rows: the layers lint-imports checks (pyproject.toml).\n"
        "Not drawn: imports by name through importlib (__main__.py -> bench).",
        labelloc="t",
        fontname="Helvetica",
        fontsize="13",
    )
    g.attr("node", shape="box", style="rounded", fontname="Helvetica", fontsize="12", margin="0.15,0.06")
    colour = {}
    previous = None
    for i, row in enumerate(r for r in ([n for n in row if n in nodes] for row in rows) if r):
        with g.subgraph(name=f"row{i}") as s:
            s.attr(rank="same")
            label = f"layer {i + 1}"  # a space: no module has that name
            s.node(label, shape="plaintext", fontcolor="#666666")
            for name in row:
                colour[name] = COLOURS[i % len(COLOURS)]
                s.node(name, _label(name, nodes[name]), color=colour[name], penwidth="1.6")
        if previous is not None:  # keeps the rows in the contract's order
            g.edge(previous, label, style="invis")
        previous = label
    g.node(API, _label(API, []), color="#333333", penwidth="1.6")  # no layer: Graphviz places it
    for a, b in sorted(edges):
        g.edge(a, b, color=colour.get(a, "#333333"), arrowsize="0.7")
    return g


def _label(name: str, modules: list[str]) -> str:
    """A node's HTML label: its name in bold, then its modules."""
    if name == API:
        title, below = "__init__.py", "the public API"
    elif modules:
        title, below = f"{name}/", " · ".join(modules)
    else:
        title, below = f"{name}.py", ""
    lines = [f"<b>{title}</b>"] + [f'<font point-size="9">{part}</font>' for part in _wrap(below, 48) if part]
    return "<" + "<br/>".join(lines) + ">"


def _wrap(text: str, width: int) -> list[str]:
    """``text`` cut at " · " into lines of about ``width`` characters."""
    lines: list[str] = []
    for word in text.split(" · "):
        if lines and len(lines[-1]) + len(word) + 3 <= width:
            lines[-1] += " · " + word
        else:
            lines.append(word)
    return lines


def main() -> int:
    nodes, edges = read_graph()
    (FIGURES / "import_graph.txt").write_text(graph_text(nodes, edges), encoding="utf-8")
    picture = draw(nodes, edges, layers())
    for fmt in ("svg", "png"):
        (FIGURES / f"import_graph.{fmt}").write_bytes(picture.pipe(format=fmt))
    print(f"wrote docs/figures/import_graph.{{txt,svg,png}}: {len(nodes)} nodes, {len(edges)} imports between them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
