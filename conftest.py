"""Markers given by where a test lives (the others are written on the tests themselves).

Every notebook run by nbval is ``slow`` (it runs a stage top to bottom); every test under
tests/browser/ is ``browser`` (JupyterLab or a page in headless Chromium) and ``slow``.
``python -m pytest -m "not slow and not browser"`` is the quick run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.suffix == ".ipynb" and item.path.is_relative_to(ROOT / "notebooks"):
            item.add_marker(pytest.mark.slow)
        if item.path.is_relative_to(ROOT / "tests" / "browser"):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)
