"""``python -m minipaged slides --lectures OUT_DIR``: the three lessons' lecture decks.

One build through the CLI (module fixture, about 20 s: the figures are drawn from engine runs)
is read by every test: three decks and an index that links them; every slide has a heading, a
few lines of text and speaker notes; every figure a slide shows is a non-empty PNG beside the
decks; no notebook cell is dumped into a deck; every script and style sheet a deck loads is a
file beside it. The committed decks (docs/teaching/slides/) are the pages a fresh build writes,
text for text, with the same figures: they cannot drift from their sources.

In the spirit of tests/course/test_answers_before_guess.py, a slide that asks a notebook's
prediction (``ask:``) shows nothing of its answer, nor does any slide before it, notes included;
and no slide shows the answer of a prediction of its lesson's notebooks that the deck never asks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_answers_before_guess import ANSWERS, leaks, literals, parse

from minipaged.__main__ import main
from minipaged.course.lectures import COMMITTED, SOURCES, Deck, Slide, figure_names, load_decks, render_all

ROOT = Path(__file__).resolve().parents[2]

DECKS = ["lesson1.html", "lesson2.html", "lesson3.html"]
LOADED = re.compile(r'<(?:script|link|img)\b[^>]*?(?:src|href)="([^"]+)"')
SECTION = re.compile(r"<section>(.*?)</section>", re.S)
PNG = b"\x89PNG\r\n\x1a\n"
# phrases that hold an answer's number for another reason (the slide's own question, a setup)
ALLOW = {
    "03_slot_mapping.ipynb/9f518172": ["token 23"],  # the question before it asks for A's token 23
    "03_slot_mapping.ipynb/67551bb2": ["26 GB", "26 tokens"],  # OPT-13B's weights; B's length
    "06_prefix_caching.ipynb/12343eeb": ["32: the block holding the last token"],  # 47f695fd's answer
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lectures")
    main(["slides", "--lectures", str(out)])
    return out


def test_the_cli_writes_three_decks_and_an_index(built, capsys):
    assert sorted(p.name for p in built.glob("*.html")) == sorted([*DECKS, "index.html"])
    index = (built / "index.html").read_text(encoding="utf-8")
    for name, deck in zip(DECKS, load_decks()):
        assert f'href="{name}"' in index and deck.title in index


def test_every_slide_has_text_and_speaker_notes(built):
    for name in DECKS:
        html = (built / name).read_text(encoding="utf-8")
        sections = SECTION.findall(html)
        assert len(sections) >= 12, f"{name}: {len(sections)} slides"
        for k, section in enumerate(sections):
            assert "<h2>" in section, f"{name} slide {k}: no heading"
            notes = re.search(r'<aside class="notes">(.*?)</aside>', section, re.S)
            assert notes and re.sub(r"<[^>]+>", "", notes.group(1)).strip(), f"{name} slide {k}: no notes"
            shown = re.sub(r'<aside class="notes">.*?</aside>', "", section, flags=re.S)
            words = len(re.sub(r"<[^>]+>", " ", shown).split())
            assert 3 <= words <= 120, f"{name} slide {k}: {words} words (a few lines, not a page)"


def test_no_notebook_cell_is_dumped(built):
    for name in DECKS:
        html = (built / name).read_text(encoding="utf-8")
        for marker in ("jp-Cell", "jp-InputArea", "input_area", "In&nbsp;[", "my_guess = None", "import "):
            assert marker not in html, f"{name}: {marker!r}: a notebook cell in a lecture deck"


def test_figures_are_png_from_the_build_and_everything_loads_from_beside(built):
    names = figure_names()
    assert len(names) >= 12
    for name in names:
        data = (built / "figures" / f"{name}.png").read_bytes()
        assert data.startswith(PNG) and len(data) > 5_000, name
    shown = set()
    for deck in DECKS:
        html = (built / deck).read_text(encoding="utf-8")
        urls = LOADED.findall(html)
        assert not [u for u in urls if "//" in u], urls
        for url in urls:
            assert (built / url).is_file(), f"{deck}: {url}"
        shown |= {Path(u).stem for u in urls if u.startswith("figures/")}
        assert len([u for u in urls if u.startswith("figures/")]) >= 4, deck
    assert shown == set(names)


def test_committed_decks_are_a_fresh_build():
    pages = render_all()
    for name, text in pages.items():
        path = COMMITTED / name
        assert path.is_file(), f"{path} missing: python -m minipaged slides --lectures docs/teaching/slides"
        assert path.read_text(encoding="utf-8") == text, f"{path} differs from its source: build it again"
    figures = sorted(p.stem for p in (COMMITTED / "figures").glob("*.png"))
    assert figures == sorted(figure_names()), "docs/teaching/slides/figures/ differs: build it again"
    assert (COMMITTED / "reveal.js" / "dist" / "reveal.js").is_file()
    size = sum(p.stat().st_size for p in COMMITTED.rglob("*") if p.is_file())
    assert size < 4_000_000, f"docs/teaching/slides/ holds {size:,} bytes"


def _text(slide: Slide) -> str:
    return "\n".join([slide.title, *slide.body, *(slide.figure or ()), *slide.notes])


def _tells(key: str) -> tuple[set[str], list[str]]:
    notebook, cell = key.split("/")
    entry = ANSWERS[notebook][cell]
    tells = set(entry.get("tells", []))
    if not entry.get("volatile"):
        tells |= literals(parse(entry["answer"]))
    return tells, entry.get("allow", []) + ALLOW.get(key, [])


def _leaks(slide: Slide, key: str) -> list[str]:
    tells, allow = _tells(key)
    text = _text(slide)
    for phrase in allow:
        text = text.replace(phrase, "")
    return sorted(t for t in tells if leaks(text, t))


@pytest.mark.parametrize("deck", load_decks(), ids=lambda d: d.name)
def test_nothing_of_an_answer_on_or_before_the_slide_that_asks(deck: Deck):
    asked = [(k, key) for k, slide in enumerate(deck.slides) for key in slide.asks]
    assert len(asked) >= 8, f"{deck.name}: {len(asked)} predictions asked"
    found = []
    for k, key in asked:
        notebook, cell = key.split("/")
        assert cell in ANSWERS.get(notebook, {}), f"{deck.name}: {key} is no prediction of answers.json"
        found += [f"{key} (slide {k}): slide {j} shows {bad}" for j in range(k + 1)
                  if (bad := _leaks(deck.slides[j], key))]  # fmt: skip
    assert not found, found


@pytest.mark.parametrize("deck", load_decks(), ids=lambda d: d.name)
def test_no_answer_shows_without_its_question(deck: Deck):
    asked = {key for slide in deck.slides for key in slide.asks}
    notebooks = {key.split("/")[0] for key in asked}
    found = []
    for notebook in sorted(notebooks):
        for cell in ANSWERS[notebook]:
            key = f"{notebook}/{cell}"
            if key not in asked:
                found += [f"{key}: slide {j} shows {bad}" for j, s in enumerate(deck.slides) if (bad := _leaks(s, key))]
    assert not found, found


def test_decks_speak_of_the_subject():
    from test_docs_wording import offending

    for path in sorted(SOURCES.glob("lesson*.md")):
        found = offending(path.read_text(encoding="utf-8"))
        assert not found, f"{path.name}: {found}"


def test_teaching_page_names_each_deck_with_its_slide_count():
    text = (ROOT / "docs" / "teaching.md").read_text(encoding="utf-8")
    decks = load_decks()
    for deck in decks:
        assert f"[{deck.name}.html](teaching/slides/{deck.name}.html) ({len(deck.slides)} slides)" in text, deck.name
    assert f"{sum(len(d.slides) for d in decks)}\nslides in all" in text or (
        f"{sum(len(d.slides) for d in decks)} slides in all" in text
    )


# A figure drawn from a committed result of docs/paper/ (minipaged/course/figures.py) -> that result's name.
PAPER_FIGURES = {"paper_memory": "fig2", "paper_throughput": "fig13", "paper_sharing": "fig15"}
SAID = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(%|x\b)")


def said_numbers(text: str) -> list[tuple[str, str]]:
    """The percentages and ratios a slide's text states: ``[("24.6", "%"), ("4.0", "x")]``."""
    return SAID.findall(text)


def agrees(number: str, values: list[float]) -> bool:
    """``number`` is one of ``values`` written to its own precision (``"46"`` for 45.54, ``"4.0"`` for 4.02)."""
    digits = len(number.partition(".")[2])
    return any(round(v, digits) == float(number) for v in values)


def test_said_numbers_and_agrees():
    assert said_numbers("Orca (Max) 24.6%, 4.0x on ShareGPT, blocks of 16, 2x") == [
        ("24.6", "%"),
        ("4.0", "x"),
        ("2", "x"),
    ]
    assert agrees("46", [45.54]) and agrees("4.0", [4.0247]) and not agrees("33.5", [45.54, 16.1])


def test_slide_text_agrees_with_its_figure_data():
    """What a slide says beside a figure of the paper's results is what the figure draws.

    Every percentage and ratio in the title and text of a slide whose figure comes from
    ``docs/paper/NAME.json`` is one of that result's values (ours or the paper's), to the precision
    written. The speaker notes may cite other runs (notebook 07's smaller replays), naming them.
    """
    from minipaged.course.figures import PAPER
    from minipaged.paper.report import load

    checked, found = 0, []
    for deck in load_decks():
        for k, slide in enumerate(deck.slides):
            if slide.figure is None or slide.figure[0] not in PAPER_FIGURES:
                continue
            result = load(PAPER, PAPER_FIGURES[slide.figure[0]])
            assert result is not None, f"docs/paper/{PAPER_FIGURES[slide.figure[0]]}.json missing"
            values = [row[key] for row in result["rows"] for key in ("ours", "paper") if row.get(key) is not None]
            for number, unit in said_numbers("\n".join([slide.title, *slide.body])):
                checked += 1
                if not agrees(number, values):
                    found.append(f"{deck.name} slide {k} ({slide.title}): {number}{unit} is not in {result['name']}")
    assert checked >= 6, f"only {checked} numbers checked: the figures' slides lost their numbers?"
    assert not found, found
