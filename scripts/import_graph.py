"""The import graph of the ``minipaged`` package, read from the code, drawn as a picture.

    python scripts/import_graph.py            # rewrite docs/figures/import_graph.{txt,svg,png}
    python scripts/import_graph.py --check    # exit 1 if the committed files are out of date

Every ``minipaged/**/*.py`` is parsed with :mod:`ast` (nothing is imported or run). An import is
an edge *importer -> imported module*, of one of four kinds:

- ``module``: at module level, run when the importer is imported;
- ``function``: inside a function, run only when it is called (a lazy import);
- ``type``: under ``if TYPE_CHECKING:``, for annotations only;
- ``by name``: a module named in a string in a file that uses :mod:`importlib`
  (``importlib.import_module("minipaged.kernels")``, or an f-string ``"minipaged.bench.{which}"``,
  which names the ``minipaged.bench`` package).

``from minipaged import LLM`` is resolved to the module that defines ``LLM``
(``minipaged.engine.llm``) by following the re-exports of ``__init__.py`` files, so an edge says
which code a module really depends on.

The picture groups modules into sub-packages (``engine/``, ``kv/``, ...) and stacks them in
layers, lowest at the bottom. Every edge is an arc from the importer to the imported box: on
the right when it points down (allowed), on the left, red, when it points up. The text file
lists the modules and every module-level edge; the SVG carries that text's SHA-256, so
``tests/test_layers.py`` can tell whether the committed picture still matches the code.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "minipaged"
FIGURES = ROOT / "docs" / "figures"
OUTPUTS = {ext: FIGURES / f"import_graph.{ext}" for ext in ("txt", "svg", "png")}
KINDS = ("module", "function", "type", "by name")

# Layers, bottom to top; the boxes of one layer are stacked top to bottom in the order listed.
# A box may import the boxes below it.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["utils"]),
    ("kv", ["kv"]),
    ("attention", ["attention"]),
    ("kernels", ["kernels"]),
    ("model", ["model"]),
    ("engine", ["engine", "static_generate"]),
    ("sim, tiny", ["sim", "tiny"]),
    ("viz, bench, paper, serve, course, CLI", ["__main__", "paper", "serve", "course", "bench", "viz", "__init__"]),
]
# Box titles other than "name/" (a sub-package) or "name.py" (a top-level module).
NODE_TITLES = {"__main__": "__main__.py  (the CLI)", "__init__": "__init__.py  (the public API)"}
MODULES_HEADER = "# modules"
BOXES_HEADER = "# top-level modules: the first line of their docstring, drawn in their box"
EDGES_HEADER = "# imports: importer -> imported [kinds, when not only a module-level import]"


@dataclass(frozen=True, order=True)
class Import:
    """``importer`` imports ``imported`` (both dotted module names), at ``path:line``."""

    importer: str
    imported: str
    kind: str
    path: str
    line: int


# -- reading the code ----------------------------------------------------------------------------
def module_name(path: Path, src_root: Path) -> str:
    """``minipaged/kv/block_pool.py`` -> ``minipaged.kv.block_pool``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(src_root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(src_root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under ``src_root/package``."""
    return {module_name(p, src_root): p for p in sorted((src_root / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _raw_imports(tree: ast.Module) -> list[tuple[ast.stmt, str]]:
    """Every import statement with its kind (module / function / type), in source order."""
    found: list[tuple[ast.stmt, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, kind))
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, "function")
            elif isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
                visit(child, "type" if kind == "module" else kind)
            else:
                visit(child, kind)

    visit(tree, "module")
    return found


def _names_in_strings(tree: ast.Module, modules: set[str], package: str) -> list[tuple[int, str]]:
    """Modules named by a string constant (exactly), or by an f-string's ``"package.sub."`` prefix."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
            if node.value != package:  # the bare package name is also the logger's name, not an import
                found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.endswith("."):
                name = head.value.rstrip(".")
                if name in modules and name != package:
                    found.append((node.lineno, name))
    return found


def _absolute(importer: str, is_package: bool, module: str | None, level: int) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in ``importer``."""
    if level == 0:
        return module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


class Resolver:
    """Turns ``(from X import name)`` into the module that defines ``name``."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files
        self.modules = set(files)
        self._exports: dict[str, dict[str, str]] = {}

    def owner(self, name: str) -> str | None:
        """``name`` if it is a module of the package, else its longest prefix that is."""
        while name and name not in self.modules:
            name = name.rpartition(".")[0]
        return name or None

    def exports(self, package: str) -> dict[str, str]:
        """Names a package's ``__init__.py`` imports at module level -> the module defining each."""
        if package not in self._exports:
            self._exports[package] = {}  # guards against cycles while it is being filled
            path = self.files[package]
            table = {}
            if path.name == "__init__.py":
                for node, kind in _raw_imports(ast.parse(path.read_text(encoding="utf-8"))):
                    if kind == "module" and isinstance(node, ast.ImportFrom):
                        source = _absolute(package, True, node.module, node.level)
                        for alias in node.names:
                            target = self.resolve_from(source, alias.name)
                            if target is not None:
                                table[alias.asname or alias.name] = target
            self._exports[package] = table
        return self._exports[package]

    def resolve_from(self, source: str, name: str) -> str | None:
        """The module ``from source import name`` depends on (None outside the package)."""
        if f"{source}.{name}" in self.modules:
            return f"{source}.{name}"
        if source not in self.modules:
            return self.owner(source)
        return self.exports(source).get(name, source)


def scan(src_root: Path = ROOT, package: str = PACKAGE) -> list[Import]:
    """Every import between modules of ``package`` (found under ``src_root``), sorted."""
    files = source_files(src_root, package)
    resolver = Resolver(files)
    found = set()
    for importer, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(src_root).as_posix()
        is_package = path.name == "__init__.py"
        uses_importlib = False
        for node, kind in _raw_imports(tree):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    uses_importlib |= alias.name == "importlib"
                    targets.append(resolver.owner(alias.name))
            else:
                source = _absolute(importer, is_package, node.module, node.level)
                uses_importlib |= source == "importlib"
                targets += [resolver.resolve_from(source, alias.name) for alias in node.names]
            for target in targets:
                if target is not None and target != importer:
                    found.add(Import(importer, target, kind, rel, node.lineno))
        if uses_importlib:
            for line, target in _names_in_strings(tree, resolver.modules, package):
                if target != importer:
                    found.add(Import(importer, target, "by name", rel, line))
    return sorted(found)


def line_counts(src_root: Path = ROOT, package: str = PACKAGE) -> dict[str, int]:
    """Lines of every module file, by path relative to ``src_root``."""
    return {
        p.relative_to(src_root).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in source_files(src_root, package).values()
    }


# -- the graph as text -----------------------------------------------------------------------------
def node_of(module: str, package: str = PACKAGE) -> str:
    """The box a module is drawn in: its sub-package (``engine``), or a top-level module (``utils``)."""
    if module == package:
        return "__init__"
    return module.split(".")[1]


def edge_kinds(imports: list[Import]) -> dict[tuple[str, str], set[str]]:
    """(importer, imported) -> the kinds of import between them."""
    edges: dict[tuple[str, str], set[str]] = {}
    for imp in imports:
        edges.setdefault((imp.importer, imp.imported), set()).add(imp.kind)
    return edges


def graph_text(src_root: Path = ROOT, package: str = PACKAGE) -> str:
    """The modules and the module-level edges, one per line: what the picture is drawn from."""
    files = source_files(src_root, package)
    lines = [
        "# The import graph of minipaged, written by scripts/import_graph.py from the code: do not edit.",
        "# Refresh with: python scripts/import_graph.py",
        "",
        MODULES_HEADER,
        *sorted(files),
        "",
        BOXES_HEADER,
        *[f"{node_of(m, package)}: {_summary(p)}" for m, p in sorted(files.items()) if p.parent == src_root / package],
        "",
        EDGES_HEADER,
    ]
    for (a, b), kinds in sorted(edge_kinds(scan(src_root, package)).items()):
        shown = "" if kinds == {"module"} else f" [{', '.join(sorted(kinds, key=KINDS.index))}]"
        lines.append(f"{a} -> {b}{shown}")
    return "\n".join(lines) + "\n"


def _summary(path: Path) -> str:
    """The first line of a module's docstring, without reStructuredText markup."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return re.sub(r":\w+:`~?([^`]+)`|``([^`]+)``", lambda m: m[1] or m[2], doc.split("\n")[0])


def _section(text: str, header: str) -> list[str]:
    """The lines under ``header`` in :func:`graph_text`'s output, up to the next blank line."""
    return text.split(header + "\n", 1)[1].split("\n\n", 1)[0].splitlines()


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


DIGEST_PREFIX = "import graph sha256: "


# -- the picture -----------------------------------------------------------------------------------
def _boxes(text: str, package: str) -> tuple[dict[str, list[str]], dict[str, str], dict[tuple[str, str], list[str]]]:
    """From :func:`graph_text`'s output: box -> its modules, box -> its summary line, and
    (importer box, imported box) -> the module imports behind that arc, as ``"a -> b (kinds)"``."""
    members: dict[str, list[str]] = {}
    for m in _section(text, MODULES_HEADER):
        members.setdefault(node_of(m, package), []).append(m)
    summaries = dict(line.split(": ", 1) for line in _section(text, BOXES_HEADER))
    arcs: dict[tuple[str, str], list[str]] = {}
    for line in _section(text, EDGES_HEADER):
        pair, _, kinds = line.partition(" [")
        a, b = pair.split(" -> ")
        if node_of(a, package) != node_of(b, package):
            short = f"{a.rpartition('.')[2]} -> {b.rpartition('.')[2]}"
            arcs.setdefault((node_of(a, package), node_of(b, package)), []).append(
                f"{short} ({kinds.rstrip(']') or 'module'})"
            )
    return members, summaries, arcs


def _ports(arcs, rank: dict[str, int], y_of: dict[str, float], box_h: float) -> dict[tuple[str, str, str], float]:
    """Where each arc meets a box's side: spread out so that arcs nest instead of crossing.

    Bottom to top along a side: the arcs to boxes below, nearest first, then those to boxes
    above, farthest first. Keys: (box, importer, imported).
    """
    ports = {}
    for node in rank:
        for side in ("down", "up"):
            ends = [(a, b) for a, b in arcs if node in (a, b) and (rank[a] > rank[b]) == (side == "down")]
            other = {e: rank[e[1] if e[0] == node else e[0]] - rank[node] for e in ends}  # < 0: below
            ends.sort(key=lambda e: (other[e] > 0, -other[e]))
            for k, e in enumerate(ends):
                ports[(node, *e)] = y_of[node] - box_h / 2 + (k + 1) / (len(ends) + 1) * box_h
    return ports


def draw(text: str, package: str = PACKAGE):
    """The picture of the graph :func:`graph_text` describes: a matplotlib ``Figure``."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle
    from matplotlib.path import Path as MPath

    members, summaries, arcs = _boxes(text, package)
    order = [node for _, nodes in LAYERS for node in reversed(nodes)]  # bottom to top
    rank = {node: i for i, node in enumerate(order)}
    row_h, box_h, box_w, x0 = 0.62, 0.46, 6.2, 1.9
    y_of = {node: r * row_h for node, r in rank.items()}
    height = row_h * len(rank) + 1.5
    fig = Figure(figsize=(14.0, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-2.6, 11.4)
    ax.set_ylim(-0.75, height - 0.75)
    ax.axis("off")
    # one colour per box, shared by the arcs leaving it; red is kept for arcs that point up
    colors = [
        "#0072B2",
        "#E69F00",
        "#009E73",
        "#CC79A7",
        "#56B4E9",
        "#8C6D31",
        "#332288",
        "#117733",
        "#882255",
        "#44AA99",
        "#999933",
        "#AA4499",
        "#661100",
        "#6699CC",
    ]
    color_of = {node: colors[i % len(colors)] for i, node in enumerate(reversed(order))}

    for i, (label, nodes) in enumerate(LAYERS):  # layer bands and their names
        lo, hi = min(y_of[n] for n in nodes) - row_h / 2, max(y_of[n] for n in nodes) + row_h / 2
        ax.add_patch(Rectangle((-2.5, lo + 0.02), 13.8, hi - lo - 0.04, color="#F2F2F2" if i % 2 else "#FAFAFA"))
        ax.text(-2.4, (lo + hi) / 2, label, va="center", fontsize=11, fontweight="bold", color="#333333")

    for node, y in y_of.items():  # a box: the sub-package and its modules, or a module and its summary
        ax.add_patch(
            FancyBboxPatch(
                (x0, y - box_h / 2),
                box_w,
                box_h,
                boxstyle="round,pad=0.02,rounding_size=0.06",
                facecolor="white",
                edgecolor=color_of[node],
                linewidth=1.8,
                zorder=2,
            )
        )
        inside = [m.rsplit(".", 1)[1] for m in members.get(node, []) if m.count(".") > 1]
        title = f"{node}/" if inside else NODE_TITLES.get(node, f"{node}.py")
        ax.text(x0 + 0.1, y + 0.08, title, va="center", fontsize=10.5, fontweight="bold", zorder=3)
        ax.text(
            x0 + 0.1,
            y - 0.12,
            " · ".join(inside) if inside else summaries.get(node, ""),
            va="center",
            fontsize=8,
            color="#333333",
            zorder=3,
        )

    ports = _ports(arcs, rank, y_of, box_h)
    for (a, b), imports in sorted(arcs.items(), key=lambda kv: -abs(rank[kv[0][0]] - rank[kv[0][1]])):
        up, span = rank[a] < rank[b], abs(rank[a] - rank[b])
        x, bulge = (x0, -(0.25 + 0.12 * span)) if up else (x0 + box_w, 0.25 + 0.29 * span)
        ya, yb = ports[(a, a, b)], ports[(b, a, b)]
        kinds = " ".join(imports)
        style = "-" if "(module" in kinds else ("--" if "(function" in kinds else ":")
        color = "#C00000" if up else color_of[a]
        path = MPath([(x, ya), (x + bulge, ya), (x + bulge, yb), (x, yb)], [MPath.MOVETO] + [MPath.CURVE4] * 3)
        ax.add_patch(
            FancyArrowPatch(
                path=path,
                arrowstyle="-|>,head_length=5,head_width=2.6",
                color=color,
                linestyle=style,
                linewidth=1.3,
                zorder=1,
                shrinkA=0,
                shrinkB=0,
            )
        )
        if up:  # the exceptions: say which modules reach up
            ax.text(
                x + 0.75 * bulge - 0.08,
                (ya + yb) / 2,
                "\n".join(imports),
                ha="right",
                va="center",
                fontsize=8,
                color=color,
            )

    top = height - 0.75
    ax.text(
        -2.4,
        top - 0.25,
        f"The import graph of {package}/, read from the code by scripts/import_graph.py",
        fontsize=13,
        fontweight="bold",
        va="center",
    )
    ax.text(
        -2.4,
        top - 0.6,
        "An arc goes from the importing box to the imported one. Right: pointing down a layer "
        "(allowed). Left, red: pointing up.\nSolid: imported at module level; dashed: only inside a function "
        "(lazy); dotted: by name (importlib) or for type checking only.",
        fontsize=9.5,
        va="center",
        color="#333333",
    )
    return fig


def write(src_root: Path = ROOT, package: str = PACKAGE) -> str:
    """Write the text, the SVG and the PNG; returns the text."""
    text = graph_text(src_root, package)
    OUTPUTS["txt"].write_text(text, encoding="utf-8")
    fig = draw(text, package)
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "minipaged"}):
        fig.savefig(OUTPUTS["svg"], metadata={"Date": None, "Description": DIGEST_PREFIX + digest(text)})
    fig.savefig(OUTPUTS["png"], dpi=90, metadata={"Software": None})
    return text


def stale(src_root: Path = ROOT, package: str = PACKAGE) -> list[str]:
    """Why the committed files do not match the code (empty when they do)."""
    text = graph_text(src_root, package)
    txt, svg = OUTPUTS["txt"], OUTPUTS["svg"]
    problems = []
    if not txt.exists() or txt.read_text(encoding="utf-8") != text:
        problems.append(f"{_shown(txt)} differs from the code's imports")
    if not svg.exists() or DIGEST_PREFIX + digest(text) not in svg.read_text(encoding="utf-8"):
        problems.append(f"{_shown(svg)} was drawn from another graph")
    return problems


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Draw minipaged's import graph into docs/figures/import_graph.*")
    p.add_argument("--check", action="store_true", help="only say whether the committed files are up to date")
    args = p.parse_args(argv)
    if args.check:
        problems = stale()
        for line in problems:
            print(line)
        if problems:
            print("refresh with: python scripts/import_graph.py")
        return 1 if problems else 0
    text = write()
    print(f"wrote {', '.join(_shown(p) for p in OUTPUTS.values())}: {text.count(' -> ')} module-to-module imports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
