"""Every relative link in the docs resolves, and every code path they quote exists.

Checked: ``README.md``, ``docs/**/*.md``, ``notebooks/README.md``, ``exercises/README.md`` and the
markdown cells of ``notebooks/*.ipynb``.

- Links ``[text](target)``, images ``![alt](target)`` and reference definitions ``[id]: target``
  whose target is relative (not ``http:``, ``mailto:``, ...) must name an existing file or
  folder, relative to the document (``#anchors`` and ``?queries`` are ignored). Links inside
  code blocks and inline code are not links.
- Inline code that is a repository path — one token starting with a top-level folder
  (``minipaged/``, ``docs/``, ``tests/`` ...), or a ``dir/file.ext`` path such as
  ``engine/llm.py`` (looked up from the root and from ``minipaged/``) — must exist. Globs and
  placeholders (``*``, ``<...>``, ``stageN``) are skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("minipaged/", "docs/", "notebooks/", "tests/", "exercises/", ".ci/")
EXTENSIONS = (".py", ".md", ".ipynb", ".json", ".toml", ".yml", ".yaml", ".png", ".svg", ".txt", ".safetensors")

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def documents() -> list[tuple[str, Path, str]]:
    """(id, folder links are relative to, markdown text) of every checked document."""
    docs = []
    files = [ROOT / "README.md", ROOT / "notebooks" / "README.md", ROOT / "exercises" / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    for path in files:
        if path.exists():
            docs.append((str(path.relative_to(ROOT)), path.parent, path.read_text(encoding="utf-8")))
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        text = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        docs.append((str(nb.relative_to(ROOT)), nb.parent, text))
    return docs


DOCS = documents()


def links(text: str) -> list[str]:
    prose = INLINE_CODE.sub(" ", FENCE.sub(" ", text))
    return LINK.findall(prose) + REF_DEF.findall(prose)


def code_paths(text: str) -> list[str]:
    """Inline-code spans that are a single repository path."""
    found = []
    for _, span in INLINE_CODE.findall(FENCE.sub(" ", text)):
        span = span.strip()
        if not span or re.search(r"[\s*<>{}$()\[\],'\"=:;|]", span) or "..." in span or "stageN" in span:
            continue
        if span.startswith(("/", "~", "./", "../")) or SCHEME.match(span):
            continue
        if span.startswith(TOP_LEVEL) or ("/" in span and span.endswith(EXTENSIONS)):
            found.append(span)
    return found


def test_documents_found():
    names = {name for name, _, _ in DOCS}
    assert "notebooks/README.md" in names and "docs/stage0.md" in names
    assert any(name.endswith(".ipynb") for name in names)


@pytest.mark.parametrize("name,folder,text", DOCS, ids=[name for name, _, _ in DOCS])
def test_relative_links_resolve(name, folder, text):
    broken = []
    for target in links(text):
        if SCHEME.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (folder / path).exists():
            broken.append(target)
    assert not broken, f"{name}: links to missing files: {broken}"


@pytest.mark.parametrize("name,folder,text", DOCS, ids=[name for name, _, _ in DOCS])
def test_quoted_code_paths_exist(name, folder, text):
    missing = []
    for span in code_paths(text):
        path = span.split("#", 1)[0].split("::", 1)[0]
        bases = (ROOT,) if span.startswith(TOP_LEVEL) else (ROOT, ROOT / "minipaged")
        if not any((base / path).exists() for base in bases):
            missing.append(span)
    assert not missing, f"{name}: quotes paths that do not exist: {missing}"


def test_checker_catches_mistakes():
    """The rules above on a made-up document: they must report what is broken, and only that."""
    text = (
        "[ok](../README.md) [anchor](stage0.md#measured) [web](https://example.com) [self](#top)\n"
        "[bad](missing.md) ![bad image](figures/nope.png)\n[ref]: ../nothing/here.md\n"
        "`minipaged/kv/block_pool.py` `engine/llm.py` `minipaged/kv/nope.py` `kv/ghost.py` `exercises/stageN_*.py`\n"
        "```\n[in a fence](not/checked.md) `minipaged/in_fence.py`\n```\n"
        "`[in code](not/a/link.md)` `python -m minipaged demo` `a/b`\n"
    )
    assert links(text) == [
        "../README.md",
        "stage0.md#measured",
        "https://example.com",
        "#top",
        "missing.md",
        "figures/nope.png",
        "../nothing/here.md",
    ]
    spans = code_paths(text)
    assert spans == ["minipaged/kv/block_pool.py", "engine/llm.py", "minipaged/kv/nope.py", "kv/ghost.py"]
    docs = ROOT / "docs"
    assert [
        t
        for t in links(text)
        if not SCHEME.match(t) and not t.startswith("#") and not (docs / t.split("#")[0]).exists()
    ] == ["missing.md", "figures/nope.png", "../nothing/here.md"]
    assert [s for s in spans if not any((b / s).exists() for b in (ROOT, ROOT / "minipaged"))] == [
        "minipaged/kv/nope.py",
        "kv/ghost.py",
    ]
