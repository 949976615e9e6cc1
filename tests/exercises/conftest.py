"""Run every exercise check twice: on the reference solution and on the learner's file.

Each test module names its exercise file in ``STAGE`` (e.g. ``"stage3_slot_mapping"``) and takes
the ``ex`` fixture, which is, in turn,

- ``exercises.solutions.<STAGE>`` (test id ``[solution]``): must pass, the suite checks the references;
- ``exercises.<STAGE>`` (test id ``[yours]``): the learner's scratch file. While a function still
  raises ``NotImplementedError`` its tests are skipped with "<file>: <name> is not written yet";
  once written, a wrong answer fails with an assertion that says what was expected.

Mark each test with the exercise it checks: ``@pytest.mark.exercise("decode_slot_mapping")``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `import exercises` works from any working directory


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "exercise(name): the exercise function or class a test checks")


@pytest.fixture(params=["solution", "yours"])
def ex(request: pytest.FixtureRequest):
    """The module under test: the reference solution, then the learner's scratch file."""
    stage = request.module.STAGE
    name = f"exercises.solutions.{stage}" if request.param == "solution" else f"exercises.{stage}"
    return importlib.import_module(name)


def _exercise_name(item: pytest.Item) -> str:
    marker = item.get_closest_marker("exercise")
    return marker.args[0] if marker else item.originalname


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    module = pyfuncitem.funcargs.get("ex")
    name = _exercise_name(pyfuncitem)
    mine = module is not None and ".solutions." not in module.__name__
    if mine and not hasattr(module, name):
        pytest.fail(f"exercises/{module.__name__.split('.')[-1]}.py has no `{name}`: keep the name from the stub",
                    pytrace=False)
    try:
        return (yield)
    except NotImplementedError:
        if mine:
            pytest.skip(f"exercises/{module.__name__.split('.')[-1]}.py: {name} is not written yet")
        raise
