"""The committed lecture decks (docs/teaching/slides/) in headless Chromium, from the file system.

For each of the three decks: reveal.js starts, it counts as many slides as the deck's source has,
every slide carries speaker notes (what reveal.js's speaker view shows), every figure has loaded
(a picture with a width), the arrow key moves to the next slide, and no request fails and no
script error shows: nothing is fetched from the network. The index links the three decks.

Needs Chromium (Debian: ``apt-get install chromium``; elsewhere set ``MINIPAGED_CHROMIUM``) and
Playwright (``pip install -e ".[test]"``); skipped with the reason when either is missing.
"""

from __future__ import annotations

import importlib.util

import pytest
from browser.jupyterlab import find_chromium

from minipaged.course.lectures import COMMITTED, load_decks

pytestmark = pytest.mark.browser
HANG_MS = 120_000  # a hang guard for each wait (the decks are local files: none comes near it)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


@pytest.fixture(scope="module")
def browser():
    if importlib.util.find_spec("playwright") is None:
        pytest.skip('playwright is not installed: pip install -e ".[test]"')
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("Chromium not found: apt-get install chromium, or point MINIPAGED_CHROMIUM at one")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=FLAGS)
        yield browser
        browser.close()


@pytest.mark.parametrize("deck", load_decks(), ids=lambda d: d.name)
def test_a_committed_deck_opens_with_its_slides_notes_and_figures(browser, deck):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    failed, errors = [], []
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto((COMMITTED / f"{deck.name}.html").as_uri(), wait_until="load")
        page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=HANG_MS)
        assert page.evaluate("Reveal.getTotalSlides()") == len(deck.slides)
        notes = page.evaluate("Reveal.getSlides().map(s => (Reveal.getSlideNotes(s) || '').trim().length)")
        assert len(notes) == len(deck.slides) and min(notes) > 0, notes
        widths = page.evaluate("Array.from(document.querySelectorAll('.reveal img')).map(i => i.naturalWidth)")
        assert len(widths) == sum(1 for s in deck.slides if s.figure) and min(widths) > 300, widths
        page.keyboard.press("ArrowRight")
        page.wait_for_function("Reveal.getIndices().h === 1", timeout=HANG_MS)
        assert not failed, f"{deck.name}: requests failed: {failed}"
        assert not errors, f"{deck.name}: errors: {errors}"
    finally:
        page.close()


def test_the_index_links_the_three_decks(browser):
    page = browser.new_page()
    try:
        page.goto((COMMITTED / "index.html").as_uri(), wait_until="load")
        links = page.evaluate("Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href'))")
        assert links == [f"{deck.name}.html" for deck in load_decks()]
    finally:
        page.close()
