"""The Chinese pages say what the English ones say: per page pair, the same headings, code, numbers and links.

Pairs: every ``docs/**/X.md`` that has a ``docs/zh/**/X.md`` (and ``exercises/README.md`` with
``exercises/README.zh.md``). A translation may reword anything else, but not these, which is where
a page that was edited in one language only shows first:

- headings: the same number of headings, level by level, outside code blocks;
- code: the same set of inline code spans (``like_this``; spaces and line breaks inside a span
  do not count). Code blocks are not compared: their comments are translated;
- numbers: the same set of numbers in the prose (``66.0``, ``4096``, ``2-4`` gives 2 and 4);
- links: the same set of targets, each resolved to a path in the repository (the Chinese page's
  ``stage0.md`` is ``docs/zh/stage0.md``, compared as ``docs/stage0.md``; anchors dropped, since
  headings are translated; ``X.zh.md`` compared as ``X.md``). Each page's link to its own
  translation, and a Chinese page's link to the Chinese index (``docs/zh/README.md``), are left out.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS, ZH = ROOT / "docs", ROOT / "docs" / "zh"

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
HEADING = re.compile(r"^(#{1,6})\s+\S", re.M)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_HREF = re.compile(r"<a\s+[^>]*href=\"([^\"]+)\"")
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?![\w])")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pairs() -> list[tuple[Path, Path]]:
    found = [(en, ZH / en.relative_to(DOCS)) for en in sorted(DOCS.rglob("*.md")) if ZH not in en.parents]
    found = [(en, zh) for en, zh in found if zh.exists()]
    readme = (ROOT / "exercises" / "README.md", ROOT / "exercises" / "README.zh.md")
    return found + ([readme] if readme[1].exists() else [])


def _prose(text: str) -> str:
    """The text without code blocks, inline code and HTML comments."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    return INLINE_CODE.sub(" ", FENCE.sub(" ", text))


def headings(text: str) -> list[int]:
    return [len(m.group(1)) for m in HEADING.finditer(FENCE.sub(" ", text))]


def code(text: str) -> set[str]:
    return {" ".join(m.group(2).split()) for m in INLINE_CODE.finditer(FENCE.sub(" ", text))}


def numbers(text: str) -> set[str]:
    prose = LINK.sub(lambda m: m.group(0).split("](")[0], _prose(text))  # link text stays, targets go
    return {n.replace(",", "") for n in NUMBER.findall(prose)}


def links(text: str, page: Path, other: Path) -> set[str]:
    """Link targets as repository paths (a Chinese page's as the English page's would be), or URLs."""
    prose = _prose(text)
    targets = LINK.findall(prose) + HTML_HREF.findall(prose)
    found = set()
    for target in targets:
        if target.startswith("#"):
            continue
        if SCHEME.match(target):
            found.add(target)
            continue
        path = posixpath.normpath(posixpath.join(page.parent.relative_to(ROOT).as_posix(), target.split("#")[0]))
        if path in (other.relative_to(ROOT).as_posix(), "docs/zh/README.md"):
            continue  # the link to this page's translation, or to the Chinese index
        found.add(re.sub(r"\.zh\.md$", ".md", re.sub(r"^docs/zh/", "docs/", path)))  # README.zh.md: README.md's
    return found


def name(pair: tuple[Path, Path]) -> str:
    return pair[0].relative_to(ROOT).as_posix()


PAIRS = pairs()


def test_pairs_found():
    names = {name(p) for p in PAIRS}
    assert {"docs/concepts.md", "docs/stage0.md", "docs/teaching.md"} <= names


@pytest.mark.parametrize("pair", PAIRS, ids=name)
def test_same_headings(pair):
    en, zh = (p.read_text(encoding="utf-8") for p in pair)
    assert headings(zh) == headings(en)


@pytest.mark.parametrize("pair", PAIRS, ids=name)
def test_same_code(pair):
    en, zh = (p.read_text(encoding="utf-8") for p in pair)
    a, b = code(en), code(zh)
    assert a == b, f"only in English: {sorted(a - b)}\nonly in Chinese: {sorted(b - a)}"


@pytest.mark.parametrize("pair", PAIRS, ids=name)
def test_same_numbers(pair):
    en, zh = (p.read_text(encoding="utf-8") for p in pair)
    a, b = numbers(en), numbers(zh)
    assert a == b, f"only in English: {sorted(a - b)}\nonly in Chinese: {sorted(b - a)}"


@pytest.mark.parametrize("pair", PAIRS, ids=name)
def test_same_links(pair):
    en_path, zh_path = pair
    a = links(en_path.read_text(encoding="utf-8"), en_path, zh_path)
    b = links(zh_path.read_text(encoding="utf-8"), zh_path, en_path)
    assert a == b, f"only in English: {sorted(a - b)}\nonly in Chinese: {sorted(b - a)}"


CHINESE_PAGES = [p for p in sorted(ZH.rglob("*.md")) if p != ZH / "README.md"]  # the index links both


@pytest.mark.parametrize("page", CHINESE_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_chinese_pages_link_chinese_pages(page):
    """A Chinese page links the Chinese version of a page wherever there is one (its own English original aside)."""
    english = DOCS / page.relative_to(ZH)
    wrong = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if SCHEME.match(target) or target.startswith("#"):
            continue
        resolved = (page.parent / target.split("#")[0]).resolve()
        if resolved != english and DOCS in resolved.parents and ZH not in resolved.parents:
            if (ZH / resolved.relative_to(DOCS)).exists():
                wrong.append(target)
    assert not wrong, f"{page.name} links English pages that have a Chinese version: {wrong}"


def test_the_checks_catch_drift(tmp_path):
    """The rules above on a made-up pair: every kind of difference is reported, and rewording is not."""
    en = "# Title\n\n## Part\n\nIt holds `x` in 4096 slots: 66.0%. See [stage 0](stage0.md) and [中文](zh/a.md).\n"
    zh = "# 标题\n\n## 部分\n\n在 4096 个槽位里放 `x`：66.0%。见 [第 0 阶段](stage0.md)，[English](../a.md)。\n"
    en_page, zh_page = tmp_path / "docs" / "a.md", tmp_path / "docs" / "zh" / "a.md"
    assert headings(en) == headings(zh) == [1, 2]
    assert code(en) == code(zh) == {"x"}
    assert numbers(en) == numbers(zh) == {"4096", "66.0", "0"}
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert links(en, en_page, zh_page) == links(zh, zh_page, en_page) == {"docs/stage0.md"}
        assert links(zh.replace("stage0.md", "stage1.md"), zh_page, en_page) == {"docs/stage1.md"}
    finally:
        ROOT = saved
    assert headings(zh + "\n### 多一节\n") != headings(en)
    assert code(zh.replace("`x`", "`y`")) != code(en)
    assert code("`a b\n c`") == code("`a  b c`") == {"a b c"}
    assert numbers(zh.replace("66.0", "65.9")) != numbers(en)
