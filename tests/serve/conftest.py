"""Fixtures for the server's tests: the embedded model behind a real server (see harness.py).

Without the server's libraries (``pip install -e ".[serve]"``, which ``.[test]`` includes) these
tests are not collected.
"""

from __future__ import annotations

import importlib.util

import pytest

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
