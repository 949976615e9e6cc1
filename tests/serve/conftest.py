"""Fixtures for the server's tests: the embedded model behind a real server (see harness.py), and
a headless Chromium for the pages.

Without the server's libraries (``pip install -e ".[serve]"``, which ``.[test]`` includes) these
tests are not collected.
"""

from __future__ import annotations

import importlib.util

import pytest

TIMEOUT_MS = 300_000  # a hang guard for every wait in a page: a waiting test waits for an event, not a time

if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="module")
def offline():
    """An engine like the server's, for the expected outputs (``LLM.generate``)."""
    from serve.harness import ENGINE

    from minipaged import LLM

    return LLM(**ENGINE)


@pytest.fixture(scope="module")
def server():
    """The embedded model behind the server, on loopback."""
    from serve.harness import ENGINE, ServerThread

    from minipaged import LLM
    from minipaged.serve.app import create_app

    with ServerThread(create_app(LLM(**ENGINE), model_name="tiny-copy")) as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium context (Playwright), for the pages' tests."""
    from browser.jupyterlab import find_chromium

    if importlib.util.find_spec("playwright") is None:
        pytest.skip('playwright is not installed: pip install -e ".[test]"')
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("Chromium not found: apt-get install chromium, or set MINIPAGED_CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=chromium,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
        )
        context = b.new_context(viewport={"width": 1280, "height": 800})
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        b.close()
