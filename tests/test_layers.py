"""The package's layering, read from the code: lower layers never import upper ones.

kv < attention < kernels < engine < viz / bench / paper / serve / course / CLI. Every import of every
``minipaged/**/*.py`` counts — at module level, inside a function, under ``TYPE_CHECKING``, or
by name through :mod:`importlib` — as parsed by ``scripts/import_graph.py`` (nothing is
imported). ``from minipaged import LLM`` counts as importing ``minipaged.engine.llm``, where
``LLM`` is defined. The same script draws ``docs/figures/import_graph.svg``; the last tests
check that the committed picture was drawn from today's imports.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def _load_script():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


graph = _load_script()
IMPORTS = graph.scan(ROOT)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# Outside the core: drawing, benchmarks, the paper's figures, the server, the course's tools, the CLI and training.
NOT_CORE = (
    "minipaged.viz",
    "minipaged.bench",
    "minipaged.paper",
    "minipaged.serve",
    "minipaged.course",
    "minipaged.__main__",
    "minipaged.tiny.train",
)

# (name, importers the rule applies to, modules they must not import, importers exempted)
RULES = [
    (
        "kv/ imports nothing from attention, kernels, engine or model",
        ("minipaged.kv",),
        ("minipaged.attention", "minipaged.kernels", "minipaged.engine", "minipaged.model"),
        (),
    ),
    (
        "kernels/ and model/ import nothing from engine",
        ("minipaged.kernels", "minipaged.model"),
        ("minipaged.engine",),
        (),
    ),
    ("attention/ imports nothing from engine", ("minipaged.attention",), ("minipaged.engine",), ()),
    (
        "the core imports nothing from viz/, bench/, paper/, serve/ or course/",
        ("minipaged",),
        ("minipaged.viz", "minipaged.bench", "minipaged.paper", "minipaged.serve", "minipaged.course"),
        NOT_CORE,
    ),
    ("utils imports nothing from the package", ("minipaged.utils",), ("minipaged",), ()),
]


def breaks(imports, importers, forbidden, exempt) -> list[str]:
    """``path:line: importer imports target`` for every import that breaks the rule.

    Importing the bare package (``import minipaged``) runs its ``__init__.py``, so it counts as
    importing everything that file imports.
    """
    root_imports = {i.imported for i in imports if i.importer == "minipaged"}
    found = []
    for imp in imports:
        if not _under(imp.importer, importers) or _under(imp.importer, exempt):
            continue
        targets = {imp.imported} | (root_imports if imp.imported == "minipaged" else set())
        bad = sorted(t for t in targets if _under(t, forbidden))
        if bad:
            found.append(
                (imp.path, imp.line, f"{imp.path}:{imp.line}: {imp.importer} imports {', '.join(bad)} ({imp.kind})")
            )
    return [line for _, _, line in sorted(found)]


@pytest.mark.parametrize("name,importers,forbidden,exempt", RULES, ids=[r[0] for r in RULES])
def test_layering_rule(name, importers, forbidden, exempt):
    found = breaks(IMPORTS, importers, forbidden, exempt)
    assert not found, f"{name}, but:\n" + "\n".join(found)


def test_the_scan_sees_the_package():
    """A scan that found nothing would pass every rule: check it reads what is known to be there."""
    pairs = {(i.importer, i.imported, i.kind) for i in IMPORTS}
    assert ("minipaged.engine.llm", "minipaged.engine.scheduler", "module") in pairs
    assert ("minipaged.kv.block_table", "minipaged.kv.block_pool", "module") in pairs
    assert ("minipaged.model.decoder", "minipaged.attention.cache_attention", "module") in pairs
    kinds = {i.kind for i in IMPORTS}
    assert {"module", "function"} <= kinds, kinds


def test_no_module_is_over_400_lines():
    counts = graph.line_counts(ROOT)
    assert len(counts) > 40
    long = {path: n for path, n in counts.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by idea): {long}"


def test_the_checker_catches_every_kind_of_import(tmp_path):
    """A made-up package that breaks the rules in every way the scan must see."""
    files = {
        "__init__.py": "from minipaged.engine.llm import LLM\n",
        "utils.py": "import os\n",
        "engine/__init__.py": "",
        "engine/llm.py": "class LLM: ...\n",
        "viz/__init__.py": "",
        "viz/draw.py": "X = 1\n",
        "kv/__init__.py": "from .pool import Pool\n",
        "kv/pool.py": textwrap.dedent("""\
            from __future__ import annotations
            from typing import TYPE_CHECKING
            from minipaged import LLM
            from . import table
            if TYPE_CHECKING:
                from minipaged.viz import draw

            class Pool:
                def grow(self):
                    from ..engine import llm
                    import minipaged.viz.draw
            """),
        "kv/table.py": "import importlib\nNAME = 'minipaged.engine.llm'\n",
        "kv/uses_root.py": "import minipaged\n",
    }
    for name, text in files.items():
        path = tmp_path / "minipaged" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    imports = graph.scan(tmp_path)
    got = {(i.importer, i.imported, i.kind, i.line) for i in imports}
    assert ("minipaged.kv.pool", "minipaged.engine.llm", "module", 3) in got  # re-export followed
    assert ("minipaged.kv.pool", "minipaged.kv.table", "module", 4) in got  # relative
    assert ("minipaged.kv.pool", "minipaged.viz.draw", "type", 6) in got
    assert ("minipaged.kv.pool", "minipaged.engine.llm", "function", 10) in got  # two dots up
    assert ("minipaged.kv.pool", "minipaged.viz.draw", "function", 11) in got
    assert ("minipaged.kv.table", "minipaged.engine.llm", "by name", 2) in got
    assert ("minipaged.kv.uses_root", "minipaged", "module", 1) in got
    assert ("minipaged.kv", "minipaged.kv.pool", "module", 1) in got

    kv_rule = RULES[0][1:]
    assert breaks(imports, *kv_rule) == [
        "minipaged/kv/pool.py:3: minipaged.kv.pool imports minipaged.engine.llm (module)",
        "minipaged/kv/pool.py:10: minipaged.kv.pool imports minipaged.engine.llm (function)",
        "minipaged/kv/table.py:2: minipaged.kv.table imports minipaged.engine.llm (by name)",
        "minipaged/kv/uses_root.py:1: minipaged.kv.uses_root imports minipaged.engine.llm (module)",
    ]
    core_rule = RULES[3][1:]
    assert [b.split(":")[1] for b in breaks(imports, *core_rule)] == ["6", "11"]
    assert breaks(imports, *RULES[4][1:]) == []  # utils imports only os


def test_import_graph_picture_is_up_to_date():
    """docs/figures/import_graph.{txt,svg} were drawn from today's imports."""
    problems = graph.stale(ROOT)
    assert not problems, "; ".join(problems) + ": run python scripts/import_graph.py and commit docs/figures/"


def test_stale_picture_is_noticed(tmp_path, monkeypatch):
    """The freshness check fails when the code's imports change and the picture does not."""
    pkg = tmp_path / "minipaged"
    (pkg / "kv").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""A package."""\n')
    (pkg / "utils.py").write_text('"""Helpers."""\n')
    (pkg / "kv" / "__init__.py").write_text("")
    (pkg / "kv" / "pool.py").write_text("from minipaged.utils import cdiv\n")
    outputs = {ext: tmp_path / f"import_graph.{ext}" for ext in ("txt", "svg")}
    monkeypatch.setattr(graph, "OUTPUTS", outputs)
    text = graph.graph_text(tmp_path)
    assert "minipaged.kv.pool -> minipaged.utils\n" in text and "utils: Helpers." in text
    outputs["txt"].write_text(text)
    outputs["svg"].write_text(f"<svg><desc>{graph.DIGEST_PREFIX}{graph.digest(text)}</desc></svg>")
    assert graph.stale(tmp_path) == []
    (pkg / "kv" / "pool.py").write_text("from minipaged.utils import cdiv\n\n\ndef f():\n    import minipaged.kv\n")
    assert len(graph.stale(tmp_path)) == 2
