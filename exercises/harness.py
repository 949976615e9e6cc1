"""The checker behind ``python -m exercises``: run a stage's checks on one file and say where it stands.

The checks are the pytest tests of ``tests/exercises/test_stageN_*.py``. Each takes the fixture
``ex``, the module under test, and is marked with the exercise it checks
(``@pytest.mark.exercise("decode_slot_mapping")``). Run by ``python -m pytest`` they check the
reference solutions in ``tests/exercises/solutions/``. Run from here they check the learner's
files instead (this module's pytest plugin puts them in ``config.stash[TARGETS]``), and every
check's outcome is sorted into what a learner needs to read:

- *not written yet*: the check hit a ``NotImplementedError`` raised in the learner's file
  (the stub's body), possibly through Triton's interpreter, which wraps it;
- *fails*: an assertion failed (its message names the inputs, what was expected and what came
  back) or the learner's code raised (the line of their file is shown);
- *pass*.

:mod:`exercises.report` holds the outcomes and turns them into text.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import linecache
import re
import signal
import sys
import traceback
from collections.abc import Generator, Iterator
from pathlib import Path
from types import FrameType, ModuleType

import pytest

from exercises.report import Check, ExerciseReport, StageReport

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "exercises"


def _checks_folder() -> Path:
    """``tests/exercises`` beside this folder; in a learner's copy (``python -m minipaged course``),
    which has no tests, that of the repository the installed minipaged comes from."""
    here = ROOT / "tests" / "exercises"
    if here.is_dir():
        return here
    import minipaged

    return Path(minipaged.__file__).resolve().parents[1] / "tests" / "exercises"


TESTS = _checks_folder()
SOLUTIONS = TESTS / "solutions"

# stage -> (file stem, notebook)
STAGES: dict[int, tuple[str, str]] = {
    0: ("stage0_contiguous", "00_contiguous_baseline"),
    1: ("stage1_allocator", "01_block_allocator"),
    2: ("stage2_block_table", "02_block_table"),
    3: ("stage3_slot_mapping", "03_slot_mapping"),
    4: ("stage4_triton", "04_triton_kernel"),
    5: ("stage5_scheduler", "05_scheduler"),
    6: ("stage6_prefix_cache", "06_prefix_caching"),
    7: ("stage7_capstone", "04_triton_kernel"),  # the capstone: the decode kernel, after notebook 04
}

TARGETS = pytest.StashKey[dict]()  # file stem -> the module the checks run on
CHECK_TIMEOUT_S = 60  # a check that runs longer is stopped: most likely an endless loop


def load_file(path: Path, name: str) -> ModuleType:
    """Import the Python file ``path`` as module ``name`` (registered in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def solution(stem: str) -> ModuleType:
    """The reference solution of one stage, ``tests/exercises/solutions/<stem>.py``."""
    name = f"exercise_solutions_{stem}"
    return sys.modules.get(name) or load_file(SOLUTIONS / f"{stem}.py", name)


def _shown(path: str | Path) -> str:
    """A path as the learner should read it: relative to the repository when it is inside."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _chain(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (Triton's interpreter wraps the original)."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _frames_in(exc: BaseException, path: Path) -> list[traceback.FrameSummary]:
    return [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]


def _describe(exc: BaseException) -> str:
    """What went wrong, in the words of the check (assertion messages say inputs, want and got)."""
    if isinstance(exc, AssertionError):
        text = str(exc)
        # pytest appends its explanation ("assert 3 == 2", then "where ..." lines). After the
        # check's own message keep only its first line, for the value that came back, and only
        # when the message does not say it ("... got ...") already.
        head, found, explanation = text.partition("\nassert ")
        if head.strip() and not head.startswith("assert "):
            first = explanation.splitlines()[0] if found and explanation else ""
            shown = first and len(first) < 100 and "got" not in head
            text = head.strip() + (f"\n(assert {first})" if shown else "")
    elif isinstance(exc, pytest.fail.Exception):  # pytest.raises that saw nothing, pytest.fail
        text = str(exc).replace("<class '", "").replace("'>", "")
    else:
        text = f"{type(exc).__name__}: {exc}"
    # pytest names functions "<function f at 0x7f...>" and adds "where f = <module ...>.f": noise here
    text = re.sub(r"<function ([\w.]+) at 0x[0-9a-f]+>", r"\1", text)
    lines = [line for line in text.strip().splitlines() if " = <module " not in line] or [type(exc).__name__]
    return "\n".join(lines[:12] + (["..."] if len(lines) > 12 else []))


def _classify(exercise: str, name: str, excinfo: pytest.ExceptionInfo | None, target: Path, printed: str) -> Check:
    if excinfo is None:
        return Check(exercise, name, "pass")
    chain = _chain(excinfo.value)
    for exc in chain:
        frames = _frames_in(exc, target)
        tb = traceback.extract_tb(exc.__traceback__)
        if isinstance(exc, NotImplementedError) and frames and tb and frames[-1] == tb[-1]:
            # raised by the learner's own file: a stub not replaced yet
            raiser = frames[-1].name
            note = "" if raiser == exercise else f"{raiser} raises NotImplementedError"
            return Check(exercise, name, "todo", note)
    outer = chain[0]
    if type(outer).__name__ == "InterpreterError" and len(chain) > 1:  # Triton's wrapper: show the original
        outer = chain[1]
    where = []
    test_frames = [f for f in traceback.extract_tb(chain[0].__traceback__) if Path(f.filename).name.startswith("test_")]
    if test_frames:
        f = test_frames[-1]
        line = (f.line or "").strip()
        if line.startswith("with ") and f.lineno:  # e.g. pytest.raises: the call under it is what matters
            line += "   " + linecache.getline(f.filename, f.lineno + 1).strip()
        where.append(f"check: {_shown(f.filename)}:{f.lineno}   {line}")
    mine = [f for exc in chain for f in _frames_in(exc, target)]
    if mine:  # the exception came out of the learner's code: show their line
        f = mine[-1]
        where.append(f"yours: {_shown(f.filename)}:{f.lineno} in {f.name}   {(f.line or '').strip()}")
    return Check(exercise, name, "fail", _describe(outer), where, printed)


def _exercise_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("exercise")
    return marker.args[0] if marker else getattr(item, "originalname", item.name)


class _Plugin:
    """Points the checks at the learner's modules and records what each one says."""

    def __init__(self, targets: dict[str, ModuleType], only: set[str] | None, timeout_s: int) -> None:
        self.targets = targets
        self.only = only
        self.timeout_s = timeout_s
        self.order: dict[str, list[str]] = {stem: [] for stem in targets}  # exercises, in file order
        self.missing: dict[str, set[str]] = {stem: set() for stem in targets}
        self.checks: dict[str, list[Check]] = {stem: [] for stem in targets}
        self.errors: list[str] = []

    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[TARGETS] = self.targets

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append(f"the checks could not be collected:\n{report.longrepr}")

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep, drop = [], []
        for item in items:
            stem, exercise = _stage_of(item), _exercise_of(item)
            if exercise not in self.order[stem]:
                self.order[stem].append(exercise)
            if self.only is not None and exercise not in self.only:
                drop.append(item)
            elif not hasattr(self.targets[stem], exercise):
                self.missing[stem].add(exercise)
                drop.append(item)
            else:
                keep.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        with _time_limit(self.timeout_s):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "call" or (report.failed and call.when == "setup"):
            stem = _stage_of(item)
            target = _file_of(self.targets[stem]).resolve()
            name = item.name.removeprefix("test_")
            self.checks[stem].append(_classify(_exercise_of(item), name, call.excinfo, target, report.capstdout))
        return report


def _stage_of(item: pytest.Item) -> str:
    """The stem of the exercise file a check's test module checks (its ``STAGE``)."""
    assert isinstance(item, pytest.Function), item  # the checks are test functions
    stage: str = item.module.STAGE
    return stage


def _file_of(module: ModuleType) -> Path:
    """The file a module was loaded from (an exercise file always has one)."""
    assert module.__file__ is not None, module
    return Path(module.__file__)


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    """Stop a check after ``seconds`` (where the OS has alarms: not on Windows)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"this check ran for more than {seconds} s: an endless loop?")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _import_error(exc: BaseException, path: Path) -> str:
    if isinstance(exc, SyntaxError):
        return f"{_shown(path)} does not import: {exc.msg} (line {exc.lineno}): {(exc.text or '').strip()}"
    frames = _frames_in(exc, path.resolve())
    line = f" (line {frames[-1].lineno})" if frames else ""
    return f"{_shown(path)} does not import: {type(exc).__name__}: {exc}{line}"


def learner_module(stage: int, file: Path | None = None) -> ModuleType:
    """The learner's module of a stage: ``exercises/<stem>.py``, or ``file`` instead."""
    stem = STAGES[stage][0]
    if file is None:
        return importlib.import_module(f"exercises.{stem}")
    return load_file(Path(file), f"exercises_file_{stem}")


def check(
    targets: dict[int, ModuleType | Path | None], only: set[str] | None = None, timeout_s: int = CHECK_TIMEOUT_S
) -> list[StageReport]:
    """Run the checks of the given stages on the given modules, in one pytest session.

    targets: stage -> the module to check (or a file to import, or None for the learner's file);
    only: run only the checks of these exercises; timeout_s: stop a check that runs longer (an
    endless loop). Returns one report per stage, in stage order.
    """
    reports, modules = _import_targets(targets)
    if modules:
        plugin = _run_checks(modules, only, timeout_s)
        for stage, report in reports.items():
            if STAGES[stage][0] in modules:
                _fill_report(report, plugin, only)
    return [reports[s] for s in sorted(reports)]


def _import_targets(
    targets: dict[int, ModuleType | Path | None],
) -> tuple[dict[int, StageReport], dict[str, ModuleType]]:
    """A report per stage, and the modules to check by stem; a file that does not import is reported now."""
    reports: dict[int, StageReport] = {}
    modules: dict[str, ModuleType] = {}
    for stage in sorted(targets):
        stem = STAGES[stage][0]
        target = targets[stage]
        path = Path(target) if isinstance(target, (str, Path)) else EXERCISES / f"{stem}.py"
        try:
            module = target if isinstance(target, ModuleType) else learner_module(stage, target and Path(target))
        except Exception as exc:  # a learner's file that does not import is a finding, not a crash
            reports[stage] = StageReport(stage, STAGES[stage][1], _shown(path), error=_import_error(exc, path))
            continue
        reports[stage] = StageReport(stage, STAGES[stage][1], _shown(_file_of(module)))
        modules[stem] = module
    return reports, modules


def _run_checks(modules: dict[str, ModuleType], only: set[str] | None, timeout_s: int) -> _Plugin:
    """One pytest session over the modules' test files, quiet; the plugin holds what it found."""
    plugin = _Plugin(modules, only, timeout_s)
    files = [str(TESTS / f"test_{stem}.py") for stem in modules]
    args = [
        "-p",
        "no:terminal",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:nbval",
        "-p",
        "no:hypothesispytest",
        "-o",
        "addopts=",
        "--capture=sys",
        f"--confcutdir={TESTS}",
        f"--rootdir={ROOT}",
        *files,
    ]
    status = pytest.main(args, plugins=[plugin])
    if status in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
        plugin.errors.append(f"the checks did not run (pytest: {pytest.ExitCode(status).name})")
    return plugin


def _fill_report(report: StageReport, plugin: _Plugin, only: set[str] | None) -> None:
    """A checked stage's report from the session: its exercises' checks, or why there are none."""
    stem = STAGES[report.stage][0]
    if plugin.errors:
        report.error = "\n".join(plugin.errors)
    wanted = [e for e in plugin.order[stem] if only is None or e in only]
    unknown = sorted((only or set()) - {e for names in plugin.order.values() for e in names})
    if unknown:
        report.error = f"no exercise {', '.join(unknown)} here; its exercises: {', '.join(plugin.order[stem])}"
    for name in wanted:
        checks = [c for c in plugin.checks[stem] if c.exercise == name]
        report.exercises.append(ExerciseReport(name, checks, name in plugin.missing[stem]))
    if not report.exercises and not report.error:
        report.error = f"no checks found for stage {report.stage} in {_shown(TESTS)}"
