"""``python -m minipaged slides OUT_DIR``: reveal.js decks that open offline, checked in headless Chromium.

The build is checked on two notebooks: 00 (display math) and 02 (a widget, shown as its saved
picture). Without a browser the test reads the HTML: every script and style sheet it loads is a
file beside it. In Chromium (Debian's ``chromium``, driven by Playwright with
``executable_path``; skipped with the reason when either is missing): reveal.js starts, the deck
has its slides, the math is typeset, and no request fails — nothing is fetched from the network.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from browser.jupyterlab import find_chromium

from minipaged.course.slides import build_slides

ROOT = Path(__file__).resolve().parents[2]
DECKS = ["00_contiguous_baseline", "02_block_table"]
LOADED = re.compile(r'<(?:script|link)\b[^>]*?(?:src|href)="([^"]+)"')


@pytest.fixture(scope="module")
def decks(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("slides")
    return build_slides(out, [ROOT / "notebooks" / f"{name}.ipynb" for name in DECKS])


def test_decks_load_only_files_beside_them(decks):
    out = decks[0].parent
    assert [d.name for d in decks] == [f"{name}.slides.html" for name in DECKS]
    assert all(name in (out / "index.html").read_text(encoding="utf-8") for name in DECKS)
    for deck in decks:
        html = deck.read_text(encoding="utf-8")
        loaded = LOADED.findall(html)
        assert loaded and not [u for u in loaded if "//" in u], [u for u in loaded if "//" in u]
        for url in loaded:
            assert (out / url.split("?")[0]).is_file(), url
        assert "https://unpkg.com" not in html and "require.js" not in html
        assert 'class="reveal"' in html and html.count("<section") >= 10


def test_a_widget_shows_its_saved_picture(decks):
    html = decks[1].read_text(encoding="utf-8")
    assert "application/vnd.jupyter.widget-view+json" not in html
    assert "VBox(children" not in html and "data:image/png;base64," in html


@pytest.mark.browser
def test_decks_open_offline_in_chromium(decks):
    if importlib.util.find_spec("playwright") is None:
        pytest.skip('playwright is not installed: pip install -e ".[test]"')
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("Chromium not found: apt-get install chromium, or point MINIPAGED_CHROMIUM at one")
    from playwright.sync_api import sync_playwright

    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=flags)
        try:
            for deck in decks:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                failed, errors = [], []
                page.on("requestfailed", lambda r, failed=failed: failed.append(r.url))
                page.on("console", lambda m, errors=errors: m.type == "error" and errors.append(m.text))
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.goto(deck.as_uri(), wait_until="load")
                page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=120_000)  # a hang guard
                assert page.evaluate("Reveal.getTotalSlides()") >= 10, deck.name
                assert page.locator(".reveal .slides section").count() >= 10
                if deck.name.startswith("00"):  # $$ ... $$ typeset by MathJax, as the browser's MathML
                    page.wait_for_selector("math", state="attached", timeout=120_000)  # a hang guard
                page.keyboard.press("ArrowRight")  # reveal.js moves to the next section
                page.wait_for_function("Reveal.getIndices().h === 1", timeout=120_000)  # a hang guard
                assert not failed, f"{deck.name}: requests failed: {failed}"
                assert not errors, f"{deck.name}: errors: {errors}"
                page.close()
        finally:
            browser.close()
