"""The Chinese pages use the glossary's terms, and none of the slips and calques once found in them.

The glossary is the table under "## 术语" in docs/zh/README.md (中文 | 英文 | 含义). Checked, on
every Chinese page a learner reads (docs/zh/**/*.md, exercises/README.zh.md, any README.zh.md,
notebooks/zh/*.md when present):

- TERMS: a near miss for a glossary term ("分块" for a tile, "基准实现", "运行最大值", "词元", ...);
- CALQUES: an English idiom put into Chinese word by word ("买" for buy, "一生" for lifetime, ...),
  and wording about how the project was made rather than about the subject;
- every glossary term is used on some page, and every term TERMS points to is in the glossary.

Each variant names the word to write instead and why; a failure names file:line. The glossary's
own section is not checked against the variants: it names them in order to forbid them. Not
checked (no regular expression tells the two apart): "序列" written for a series, not a sequence.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY_PAGE = ROOT / "docs" / "zh" / "README.md"
GLOSSARY_HEADING = "## 术语"


@dataclass(frozen=True)
class Variant:
    """A forbidden way of writing something: ``pattern`` (a regular expression) and what to write instead."""

    pattern: str
    preferred: str  # what the message tells the writer to use
    reason: str
    example: str  # a line the pattern must catch (the checker's own test)
    term: str | None = None  # the glossary's Chinese term this variant stands in for, if any


TERMS: tuple[Variant, ...] = (
    Variant(
        r"分块(?!预填充)",
        "tile（内核一次处理的一小块）；流式输出的 chunk 写“片段”",
        "“分块”只用在“分块预填充”（chunked prefill）里",
        "每个 K/V 分块每组只加载一次",
        "tile",
    ),
    Variant(
        r"基准实现",
        "参考实现",
        "reference / oracle 译作参考实现；“基准”只指基准测试",
        "作为基准实现",
        "参考实现",
    ),
    Variant(
        r"基准(?!测试|实现)",
        "参考实现（reference）、基线（baseline）或基准测试（benchmark）",
        "“基准”只用在“基准测试”（benchmark）里",
        "作为易读的基准",
        "基准测试",
    ),
    Variant(
        r"运行最大值",
        "当前最大值",
        "running max 是在线 softmax 的当前最大值",
        "运行最大值从不更新",
        "当前最大值 / 当前和",
    ),
    Variant(
        r"运行总和|运行和(?=\s*(?:`|、|，|,|）|\)|$))",
        "当前和",
        "running sum 是在线 softmax 的当前和",
        "在线 softmax（最大值、运行和、累加器）",
        "当前最大值 / 当前和",
    ),
    Variant(r"词元", "token", "本项目的中文保留 token，不译", "每个词元的 K/V"),
    Variant(
        r"(?<!事)先知(?!道)",
        "预知方案（第一次出现写“理想预知方案（Oracle）”）",
        "“先知”读作 prophet；oracle 在这里是事先知道回答长度的预留方案",
        "恰好预留的先知平均也有三分之一空着",
        "预知方案",
    ),
    Variant(r"屏蔽", "掩码（加掩码、被掩码遮住）", "mask 只用一个词：掩码", "屏蔽尾部的槽位", "掩码"),
    Variant(
        r"自带的?(?:小)?模型", "内置模型", "embedded model 只用一个词：内置模型", "用自带的小模型跑一遍", "内置模型"
    ),
    Variant(
        r"空闲链表",
        "空闲列表（free list）或空闲队列（free queue）",
        "free list 译作空闲列表",
        "打乱空闲链表",
        "空闲列表",
    ),
)

CALQUES: tuple[Variant, ...] = (
    Variant(r"买", "收益、换来", "buy（得到）的直译", "批处理就什么也买不到"),
    Variant(r"一生(?!成)", "从开始到结束、直到结束", "lifetime 的直译", "请求一生中有一半时间是半空的"),
    Variant(r"在工作(?!线程|进程)", "由……完成、用上", "at work / works 的直译", "你的内核在工作：把 K/V 写进缓存"),
    Variant(r"付费|付两次|付一次", "开销、代价、算两遍、做一次", "pay for 的直译", "解释器为每个程序付费"),
    Variant(r"活着|存活", "仍在使用的、在系统里停留", "live 的直译", "把活着的缓冲区挪到一起"),
    Variant(r"另有故事", "情况特殊", "has its own story 的直译", "A 的第三个块另有故事"),
    Variant(r"欠下|不欠", "还没做的、待做的", "owe 的直译", "丢掉它欠下的拷贝"),
    Variant(r"几乎免费", "几乎不增加开销", "nearly free 的直译", "更多的行就不再几乎免费了"),
    Variant(r"交谈", "通信", "talk to 的直译", "其他部分都通过队列和它交谈"),
    Variant(
        r"告诉每(?:个注意力层|一层)的东西",
        "传给每个注意力层的信息",
        "what it tells each layer 的直译",
        "一步告诉每一层的东西",
    ),
    Variant(
        r"审查报告",
        "直接讲引擎本身",
        "页面只讲内容，不讲这个项目是怎样做出来的",
        "引发这个项目的那份审查报告",
    ),
)

FORBIDDEN = TERMS + CALQUES


def chinese_pages() -> list[Path]:
    """Every Chinese text file a learner reads (notebooks/zh/ only once it exists)."""
    pages = sorted((ROOT / "docs" / "zh").rglob("*.md"))
    pages += sorted(ROOT.glob("README.zh.md")) + sorted(ROOT.glob("*/README.zh.md"))
    pages += sorted((ROOT / "notebooks" / "zh").glob("*.md"))
    return pages


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _section(lines: list[str], heading: str) -> range:
    """The indices of the lines under ``heading`` (up to the next heading of its level or above)."""
    start = lines.index(heading)
    level = len(heading.split(" ", 1)[0])
    end = next((i for i in range(start + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines))
    return range(start, end)


def checked_lines(path: Path, glossary_page: Path = GLOSSARY_PAGE) -> list[tuple[int, str]]:
    """(line number, line) for every line of ``path`` the variants apply to: all but the glossary's own."""
    lines = path.read_text(encoding="utf-8").splitlines()
    own = path.resolve() == glossary_page.resolve() and GLOSSARY_HEADING in lines
    skip = _section(lines, GLOSSARY_HEADING) if own else range(0)
    return [(i + 1, line) for i, line in enumerate(lines) if i not in skip]


@dataclass(frozen=True)
class Slip:
    where: str  # file:line
    found: str
    variant: Variant
    line: str

    def __str__(self) -> str:
        v = self.variant
        return f"{self.where}: “{self.found}” -> write {v.preferred} ({v.reason}): {self.line.strip()[:80]}"


def find_slips(
    path: Path, variants: tuple[Variant, ...] = FORBIDDEN, glossary_page: Path = GLOSSARY_PAGE
) -> list[Slip]:
    """Every occurrence of one of ``variants`` in ``path``, with its file:line."""
    compiled = [(v, re.compile(v.pattern)) for v in variants]
    return [
        Slip(f"{_rel(path)}:{lineno}", m.group(0), variant, line)
        for lineno, line in checked_lines(path, glossary_page)
        for variant, regex in compiled
        for m in regex.finditer(line)
    ]


@dataclass(frozen=True)
class Entry:
    chinese: str
    english: str
    meaning: str

    def terms(self) -> list[str]:
        """The Chinese terms of the row: "块 / 物理块 / 逻辑块" and "块池、空闲队列" hold several."""
        return [t.strip() for t in re.split(r"\s*/\s*|、", self.chinese) if t.strip()]


def glossary(path: Path = GLOSSARY_PAGE) -> list[Entry]:
    """The rows of the table under the glossary heading."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [lines[i] for i in _section(lines, GLOSSARY_HEADING) if lines[i].startswith("|")]
    cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in rows]
    assert cells and cells[0] == ["中文", "英文", "含义"], f"{path}: the glossary's header must be 中文 | 英文 | 含义"
    body = [c for c in cells[1:] if not all(set(x) <= set("-: ") for x in c)]
    bad = [c for c in body if len(c) != 3 or not all(c)]
    assert not bad, f"{path}: glossary rows need three non-empty cells: {bad}"
    return [Entry(*c) for c in body]


def _ids(path: Path) -> str:
    return _rel(path)


def test_glossary_parses():
    entries = glossary()
    assert len(entries) >= 25, [e.chinese for e in entries]
    assert {"分页注意力", "参考实现", "tile", "当前最大值", "基准测试"} <= {t for e in entries for t in e.terms()}


@pytest.mark.parametrize("path", chinese_pages(), ids=_ids)
def test_page_uses_the_glossary_terms(path):
    slips = find_slips(path, TERMS)
    assert not slips, "\n".join(map(str, slips))


@pytest.mark.parametrize("path", chinese_pages(), ids=_ids)
def test_page_has_no_calque(path):
    slips = find_slips(path, CALQUES)
    assert not slips, "\n".join(map(str, slips))


def test_every_glossary_term_is_used():
    """A glossary term that no page uses is either stale or misspelled on every page."""
    texts = ["\n".join(line for _, line in checked_lines(p)) for p in chinese_pages()]
    unused = [t for e in glossary() for t in e.terms() if not any(t in text for text in texts)]
    assert not unused, f"glossary terms used on no Chinese page: {unused}"


def test_the_variants_point_at_glossary_terms():
    entries = glossary()
    terms = {e.chinese for e in entries} | {t for e in entries for t in e.terms()}
    missing = [v.term for v in FORBIDDEN if v.term is not None and v.term not in terms]
    assert not missing, f"the variants name terms the glossary lacks: {missing}"


def test_the_checker_catches_each_variant(tmp_path):
    """It can fail: each variant's example is caught on its own line, the message naming the preferred term."""
    allowed = [
        "长提示词用分块预填充（chunked prefill）",
        "`python -m minipaged bench` 是基准测试",
        "等待、运行和换出三个队列",
        "把每次 step() 交给工作线程",
        "统一生成一帧",
        "每个 K/V tile 每组只加载一次；当前最大值、当前和",
    ]
    page = tmp_path / "page.md"
    page.write_text("\n".join(allowed + [v.example for v in FORBIDDEN]) + "\n", encoding="utf-8")
    slips = find_slips(page)
    lines = {variant: f"{page}:{len(allowed) + i + 1}" for i, variant in enumerate(FORBIDDEN)}
    assert {s.where for s in slips} == set(lines.values()), "\n".join(map(str, slips))
    for variant, where in lines.items():
        here = [s for s in slips if s.where == where]
        assert variant in [s.variant for s in here], (variant, here)
        assert all(str(s).startswith(f"{where}: ") and s.variant.preferred in str(s) for s in here)
    assert [s.where for s in find_slips(page, TERMS)] == [lines[v] for v in TERMS]


def test_the_glossary_section_itself_is_not_checked(tmp_path):
    page = tmp_path / "README.md"
    page.write_text(f"# 目录\n\n{GLOSSARY_HEADING}\n\n不译作“分块”\n\n## 另一节\n\n一个分块\n", encoding="utf-8")
    assert [s.where for s in find_slips(page, glossary_page=page)] == [f"{page}:9"]
    assert [s.where for s in find_slips(page)] == [f"{page}:5", f"{page}:9"]


def _docs_wording():
    """tests/test_docs_wording.py, loaded from its file (the tests folder is not a package)."""
    spec = importlib.util.spec_from_file_location("_docs_wording", ROOT / "tests" / "test_docs_wording.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", [p for p in chinese_pages() if not p.is_relative_to(ROOT / "docs")], ids=_ids)
def test_chinese_page_outside_docs_speaks_of_the_subject(path):
    """test_docs_wording.py reads docs/ (both languages); its rule, for the Chinese pages outside docs/."""
    found = _docs_wording().offending(path.read_text(encoding="utf-8"))
    assert not found, f"{_rel(path)}: {found}"
