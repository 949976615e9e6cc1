"""Check your exercises: ``python -m exercises stage3`` (one stage), ``python -m exercises`` (all);
``python -m exercises engine`` serves the demo workload with every stage you passed in the engine.

Run from the repository root. See ``exercises/README.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ALIASES = {"capstone": 7}  # the stages with a name as well as a number


def _stage(text: str) -> int:
    number = text.lower().removeprefix("stage")
    if number in ALIASES:
        return ALIASES[number]
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"not a stage: {text!r} (stage0 .. stage7, or capstone)")
    return int(number)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["engine"]:
        engine = argparse.ArgumentParser(
            prog="python -m exercises engine",
            description="Serve the demo workload through minipaged.LLM with the pieces of every stage whose "
            "checks pass plugged in, and compare each completion with the package's engine.",
        )
        engine.add_argument("--num-prompts", type=int, default=4, help="copy prompts to serve (default 4)")
        from exercises import engine as plug

        return plug.main(engine.parse_args(argv[1:]).num_prompts)
    parser = argparse.ArgumentParser(
        prog="python -m exercises",
        description="Check your exercises (exercises/stageN_*.py) and say where you stand.",
        epilog="examples: python -m exercises stage3 · python -m exercises stage3 gather_sequence_kv · "
        "python -m exercises capstone · python -m exercises · python -m exercises engine (your code runs the engine)",
    )
    parser.add_argument(
        "stage", nargs="?", type=_stage, help="stage0 .. stage7 (or 0 .. 7, capstone = 7); every stage if left out"
    )
    parser.add_argument("exercise", nargs="*", help="check only these exercises of the stage")
    parser.add_argument("--file", type=Path, help="check this file instead of exercises/stageN_*.py")
    parser.add_argument("-v", "--verbose", action="store_true", help="show every failing check, not only the first")
    args = parser.parse_args(argv)
    if args.stage is None and (args.exercise or args.file):
        parser.error("name a stage to check single exercises or another file, e.g. python -m exercises stage3")
    try:
        from exercises import harness
        from exercises.report import format_stage, format_table
    except ImportError as exc:
        print(f"python -m exercises needs pytest and the minipaged package ({exc}): pip install -e '.[test]'")
        return 2
    if args.stage is not None and args.stage not in harness.STAGES:
        parser.error(f"not a stage: {args.stage} (stage0 .. stage{max(harness.STAGES)}, or capstone)")

    if args.stage is None:
        reports = harness.check(dict.fromkeys(harness.STAGES))
        print(format_table(reports))
    else:
        reports = harness.check({args.stage: args.file}, only=set(args.exercise) or None)
        print(format_stage(reports[0], args.verbose))
    return 0 if all(r.passed for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
