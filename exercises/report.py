"""What ``python -m exercises`` found, and how it reads: one line per exercise, the failing checks, a verdict.

:mod:`exercises.harness` fills these reports; the functions below turn them into the text a
learner reads. The last line of a stage always starts ``stage N:`` and says ``not written yet``,
``all K checks pass``, or how many exercises pass and which fail or are still to write.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Check:
    """The outcome of one check: ``"pass"``, ``"fail"`` or ``"todo"`` (not written yet).

    message: for a failure, what the check says went wrong (for a todo, which function still
    raises ``NotImplementedError`` when it is not the exercise itself); where: the line of the
    check and, when the error came out of the learner's code, their line; printed: what the
    learner's code printed during the check.
    """

    exercise: str
    name: str
    outcome: str
    message: str = ""
    where: list[str] = field(default_factory=list)
    printed: str = ""


@dataclass
class ExerciseReport:
    name: str
    checks: list[Check] = field(default_factory=list)
    missing: bool = False  # the learner's file has no such name

    @property
    def status(self) -> str:
        """``"missing"``, ``"fail"``, ``"todo"`` or ``"pass"``: the worst outcome of its checks."""
        if self.missing:
            return "missing"
        outcomes = {c.outcome for c in self.checks}
        return "fail" if "fail" in outcomes else "todo" if "todo" in outcomes else "pass"

    def failing(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "fail"]


@dataclass
class StageReport:
    stage: int
    notebook: str
    path: str  # the file checked, as shown
    exercises: list[ExerciseReport] = field(default_factory=list)
    error: str = ""  # the file does not import, or the checks could not run

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.exercises) and all(e.status == "pass" for e in self.exercises)

    def exercise(self, name: str) -> ExerciseReport:
        return next(e for e in self.exercises if e.name == name)


_WORDS = {"pass": "pass", "fail": "FAIL", "todo": "not written yet", "missing": "missing"}


def _status_line(e: ExerciseReport, width: int) -> str:
    checks = len(e.checks)
    detail = {
        "pass": f"{checks} check{'s' * (checks != 1)}",
        "fail": f"{len(e.failing())} of {checks} checks fail",
        "todo": next((c.message for c in e.checks if c.outcome == "todo" and c.message), ""),
        "missing": "not in your file: keep the name from the stub",
    }[e.status]
    return f"  {e.name:<{width}}  {_WORDS[e.status]:<15}  {detail}".rstrip()


def verdict(report: StageReport) -> str:
    """The one line that says where a stage stands."""
    head = f"stage {report.stage}:"
    if report.error:
        return f"{head} {report.error.splitlines()[0]}"
    statuses = [e.status for e in report.exercises]
    if report.passed:
        return f"{head} all {sum(len(e.checks) for e in report.exercises)} checks pass"
    if all(s == "todo" for s in statuses):
        return f"{head} not written yet"
    parts = [f"{statuses.count('pass')} of {len(statuses)} exercises pass"]
    for status, words in (("fail", "failing"), ("todo", "not written yet"), ("missing", "missing")):
        names = [e.name for e in report.exercises if e.status == status]
        if names:
            parts.append(f"{words}: {', '.join(names)}")
    return f"{head} " + "; ".join(parts)


def format_stage(report: StageReport, verbose: bool = False) -> str:
    """One stage in detail: each exercise's status, then the first failing check of each (all with verbose)."""
    lines = [f"stage {report.stage} · {report.path} · notebook {report.notebook}", ""]
    if report.error:  # its first line is the verdict's
        more = report.error.splitlines()[1:]
        return "\n".join([*lines, *more, *[""] * bool(more), verdict(report)])
    width = max(len(e.name) for e in report.exercises)
    lines += [_status_line(e, width) for e in report.exercises]
    for e in report.exercises:
        failing = e.failing()
        for check in failing if verbose else failing[:1]:
            lines += ["", f"FAIL {e.name} · check {check.name}"]
            lines += ["  " + line for line in check.message.splitlines()]
            lines += ["  " + line for line in check.where]
            if check.printed.strip():
                printed = check.printed.strip().splitlines()
                lines += ["  printed during this check:"] + ["    " + line for line in printed[:20]]
                lines += ["    ..."] if len(printed) > 20 else []
        if len(failing) > 1 and not verbose:
            others = len(failing) - 1
            lines.append(f"  ({others} more failing check{'s' * (others != 1)} of {e.name}: add -v to see them all)")
    if any(e.status == "todo" for e in report.exercises):
        lines += ["", f"Not written yet: replace `raise NotImplementedError` in {report.path}."]
    return "\n".join([*lines, "", verdict(report)])


def format_table(reports: list[StageReport]) -> str:
    """Every stage on one line each."""
    width = max(len(r.path) for r in reports)
    lines = [f"stage  {'your file':<{width}}  where you stand"]
    for r in reports:
        lines.append(f"{r.stage:<5}  {r.path:<{width}}  {verdict(r).split(': ', 1)[1]}")
    lines += ["", "One stage in detail, with what fails and why: python -m exercises stage3"]
    return "\n".join(lines)
