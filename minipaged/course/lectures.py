"""Lecture decks: three reveal.js decks written as markdown, with figures from real engine runs.

``python -m minipaged slides --lectures OUT_DIR`` builds one deck per lesson of docs/teaching.md,
and ``index.html`` linking them (docs/teaching/slides/ holds them built):

1. ``lesson1.html`` — paging (notebooks 00-03): the contiguous waste, blocks and the free queue,
   block tables, slot mapping;
2. ``lesson2.html`` — kernels and scheduling (04-05): the paged attention kernel, the online
   softmax, continuous batching, chunked prefill, preemption;
3. ``lesson3.html`` — sharing and the paper (06-07): prefix caching, copy-on-write, parallel
   sampling and beam search, the paper's results, the live classroom on the real model.

A deck's source is ``lectures/lessonN.md``: a ``title:`` line, then slides separated by lines
``---``. A slide is a ``## heading``, a few lines of text (paragraphs, ``- `` bullets,
``**bold**``, ```code```), at most one figure ``![caption](fig:NAME)`` and, after a line
``Note:``, the speaker notes (reveal.js ``<aside class="notes">``; press ``s`` in a deck). A line
``ask: NOTEBOOK/CELL`` marks a slide that asks a notebook's prediction (its key in the course's
answer list): nothing of the answer may show on that slide or before it, only on the slides after.

Figures are drawn by :mod:`minipaged.course.figures` and saved as ``OUT_DIR/figures/NAME.png``.
reveal.js is copied beside the decks by :func:`minipaged.course.slides.copy_assets` (no MathJax:
the lectures hold no display math), so a deck opens from the file system, offline, and the
folder can be copied anywhere as it is.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "lectures"
REPO = HERE.parents[1]
COMMITTED = REPO / "docs" / "teaching" / "slides"
KEYS = "Arrows or space move; s: speaker view with the notes; f: full screen; Esc: overview."
FIGURE_DPI = 80  # 12-inch figures come out ~1000 px wide: sharp on a projector, small on disk

FIGURE = re.compile(r"^!\[([^\]]*)\]\(fig:(\w+)\)$")
INLINE = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`")


@dataclass
class Slide:
    """One slide: its heading, body lines, figure (name, caption), notes, and the prediction it asks."""

    title: str
    body: list[str] = field(default_factory=list)
    figure: tuple[str, str] | None = None
    notes: list[str] = field(default_factory=list)
    asks: list[str] = field(default_factory=list)


@dataclass
class Deck:
    """One lesson's deck: its file name (``lesson1``), title and slides."""

    name: str
    title: str
    slides: list[Slide]


def parse(text: str, name: str) -> Deck:
    """A deck from its markdown source (the format is in this module's docstring)."""
    head, *chunks = re.split(r"^---$", text, flags=re.M)
    match = re.search(r"^title:\s*(.+)$", head, re.M)
    if match is None:
        raise ValueError(f"{name}: the source starts with a 'title:' line")
    return Deck(name, match.group(1).strip(), [parse_slide(chunk, name) for chunk in chunks])


def parse_slide(chunk: str, name: str) -> Slide:
    """One slide from the text between two ``---`` lines of deck ``name``."""
    lines = chunk.strip().splitlines()
    if not lines or not lines[0].startswith("## "):
        raise ValueError(f"{name}: a slide starts with '## heading', not {lines[:1]}")
    slide, in_notes = Slide(lines[0][3:].strip()), False
    for line in lines[1:]:
        if line.strip() == "Note:":
            in_notes = True
        elif in_notes:
            slide.notes.append(line)
        elif line.startswith("ask:"):
            slide.asks.append(line[4:].strip())
        elif m := FIGURE.match(line.strip()):
            if slide.figure is not None:
                raise ValueError(f"{name}: slide {slide.title!r} has two figures")
            slide.figure = (m.group(2), m.group(1))
        else:
            slide.body.append(line)
    if not "".join(slide.notes).strip():
        raise ValueError(f"{name}: slide {slide.title!r} has no speaker notes")
    return slide


def load_decks() -> list[Deck]:
    """The three lessons' decks, from ``lectures/lesson*.md``."""
    return [parse(p.read_text(encoding="utf-8"), p.stem) for p in sorted(SOURCES.glob("lesson*.md"))]


def inline(text: str) -> str:
    """``**bold**`` and ```code``` as HTML, everything else escaped."""
    out, last = [], 0
    for m in INLINE.finditer(text):
        out.append(html.escape(text[last : m.start()], quote=False))
        bold, code = m.groups()
        out.append(f"<strong>{inline(bold)}</strong>" if bold is not None else f"<code>{html.escape(code)}</code>")
        last = m.end()
    return "".join(out) + html.escape(text[last:], quote=False)


def blocks(lines: list[str]) -> str:
    """Paragraphs (blank-line separated) and ``- `` bullet lists as HTML."""
    out: list[str] = []
    para: list[str] = []
    items: list[str] = []

    def flush() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for raw in lines:
        line = raw.strip()
        if not line:
            flush()
        elif line.startswith("- "):
            if para:
                flush()
            items.append(line[2:])
        elif items and raw.startswith("  "):
            items[-1] += " " + line
        else:
            if items:
                flush()
            para.append(line)
    flush()
    return "\n".join(out)


def slide_html(slide: Slide) -> str:
    parts = [f"<h2>{inline(slide.title)}</h2>"]
    text = blocks(slide.body)
    if slide.figure:
        name, caption = slide.figure
        img = f'<img src="figures/{name}.png" alt="{html.escape(caption)}">'
        parts.append(f'<div class="cols"><div class="text">{text}</div><figure>{img}'
                     f"<figcaption>{inline(caption)}</figcaption></figure></div>")  # fmt: skip
    else:
        parts.append(f'<div class="text wide">{text}</div>')
    parts.append(f'<aside class="notes">{blocks(slide.notes)}</aside>')
    return "<section>\n" + "\n".join(parts) + "\n</section>"


STYLE = """
.reveal h2 { font-size: 1.5em; text-align: left; }
.reveal .cols { display: flex; gap: 1.2em; align-items: flex-start; text-align: left; }
.reveal .text { flex: 0 0 34%; font-size: 0.62em; }
.reveal .text.wide { font-size: 0.8em; text-align: left; }
.reveal figure { flex: 1; margin: 0; }
.reveal figure img { max-width: 100%; max-height: 560px; margin: 0; }
.reveal figcaption { font-size: 0.45em; color: #555; }
.reveal ul { display: block; }
"""


def render(deck: Deck, reveal_url: str) -> str:
    """The deck's HTML page, loading reveal.js from ``reveal_url`` (a relative path)."""
    slides = "\n".join(slide_html(s) for s in deck.slides)
    url = html.escape(reveal_url)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(deck.title)}</title>
<link rel="stylesheet" href="{url}/dist/reveal.css">
<link rel="stylesheet" href="{url}/dist/theme/white.css">
<style>{STYLE}</style>
</head>
<body>
<div class="reveal"><div class="slides">
{slides}
</div></div>
<script src="{url}/dist/reveal.js"></script>
<script src="{url}/plugin/notes/notes.js"></script>
<script>
Reveal.initialize({{ hash: true, slideNumber: "c/t", width: 1280, height: 760, plugins: [RevealNotes] }});
</script>
</body>
</html>
"""


def render_all() -> dict[str, str]:
    """File name -> HTML of every page :func:`build_lectures` writes: the decks and ``index.html`` (no figures)."""
    from minipaged.course.slides import index_page

    decks = load_decks()
    pages = {f"{deck.name}.html": render(deck, "reveal.js") for deck in decks}
    pages["index.html"] = index_page(
        [Path(name) for name in pages], heading="minipaged: the three lessons' lecture decks",
        labels=[deck.title for deck in decks], keys=KEYS,
    )  # fmt: skip
    return pages


def figure_names() -> list[str]:
    """Every figure the decks show, in order of first use."""
    return list(dict.fromkeys(s.figure[0] for deck in load_decks() for s in deck.slides if s.figure))


def build_lectures(out_dir: Path, figures: bool = True) -> list[Path]:
    """Write the three decks and ``index.html`` into ``out_dir``, with reveal.js beside them and, unless
    ``figures=False``, their figures drawn from engine runs; returns the decks."""
    from minipaged.course.figures import FIGURES
    from minipaged.course.slides import copy_assets

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    copy_assets(out_dir, mathjax=False)
    used = figure_names()
    missing = sorted(set(used) - set(FIGURES))
    if missing:
        raise ValueError(f"slides name figures that minipaged.course.figures does not draw: {missing}")
    if figures:
        import matplotlib.pyplot as plt

        from minipaged.viz.style import save_figure

        for name in used:
            fig = FIGURES[name]()
            save_figure(fig, out_dir / "figures" / f"{name}.png", dpi=FIGURE_DPI)
            plt.close(fig)
    written = []
    for name, text in render_all().items():
        (out_dir / name).write_text(text, encoding="utf-8")
        if name != "index.html":
            written.append(out_dir / name)
    return written
