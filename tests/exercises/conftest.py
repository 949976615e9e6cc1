"""The checks of the exercises, one test file per stage, run on the reference solutions.

Each test module names its stage's file in ``STAGE`` (e.g. ``"stage3_slot_mapping"``), takes
the ``ex`` fixture (the module under test) and is marked with the exercise it checks:
``@pytest.mark.exercise("decode_slot_mapping")``.

- ``python -m pytest tests/exercises``: ``ex`` is the reference solution
  (``tests/exercises/solutions/<STAGE>.py``); every check must pass.
- ``python -m exercises stage3``: the same checks on the learner's ``exercises/<STAGE>.py``;
  ``exercises/harness.py`` puts the modules in ``config.stash[TARGETS]`` and reads the outcomes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `import exercises` works from any working directory

from exercises import harness  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "exercise(name): the exercise function or class a test checks")


@pytest.fixture
def ex(request: pytest.FixtureRequest):
    """The module under test: the reference solution, or the learner's file under ``python -m exercises``."""
    targets = request.config.stash.get(harness.TARGETS, None)
    stem = request.module.STAGE
    return targets[stem] if targets is not None else harness.solution(stem)


@pytest.fixture
def reference(request: pytest.FixtureRequest):
    """The reference solution of the test module's stage (an oracle for random cases)."""
    return harness.solution(request.module.STAGE)


def _learner_hint(config: pytest.Config) -> bool:
    """Whether this pytest run targets the exercise checks only (a learner may have typed it)."""
    tests = Path(__file__).parent
    paths = [Path(str(a).split("::")[0]).resolve() for a in config.args]
    return bool(paths) and all(p == tests or tests in p.parents for p in paths) and harness.TARGETS not in config.stash


HINT = "These checks ran on the reference solutions. To check YOUR exercises: python -m exercises stageN (e.g. stage3)"


def pytest_report_header(config: pytest.Config) -> str | None:
    return HINT if _learner_hint(config) else None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _learner_hint(config):
        terminalreporter.write_line(HINT, yellow=True)
