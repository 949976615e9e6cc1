"""Check your work: ``python -m exercises`` (your engine, ``my_engine/``, stage by stage, then every
exercise), ``python -m exercises my_engine 3`` (one stage of your engine, in detail),
``python -m exercises stage3`` (one stage's exercises); ``python -m exercises engine`` serves the
demo workload with every exercise stage you passed in the package's engine; ``python -m exercises
serve`` puts your engine (``my_engine/``) behind the classroom server.

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
    if argv[:1] == ["my_engine"]:
        return my_engine_main(argv[1:])
    if argv[:1] == ["serve"]:
        return serve_main(argv[1:])
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
        engine_passed = _my_engine_summary(harness.ROOT)
        reports = harness.check(dict.fromkeys(harness.STAGES))
        print(format_table(reports))
        return 0 if engine_passed and all(r.passed for r in reports) else 1
    else:
        reports = harness.check({args.stage: args.file}, only=set(args.exercise) or None)
        print(format_stage(reports[0], args.verbose))
    return 0 if all(r.passed for r in reports) else 1


def _my_engine_summary(root: Path) -> bool:
    """Print where ``root/my_engine`` stands, stage by stage; whether every check of every stage passes."""
    from minipaged.course import my_engine

    if not (root / my_engine.PACKAGE).is_dir():
        print(f"(no {my_engine.PACKAGE}/ here: `python -m minipaged course OUT` writes a copy with one)\n")
        return True
    from minipaged.course.my_engine.serving import PIECES, whose_pieces

    results = {stage: my_engine.run(stage, root=root) for stage in my_engine.STAGES}
    print(my_engine.summary(results))
    yours = whose_pieces(results).yours
    print(f"Your engine: {len(yours)} of the engine's {len(PIECES)} pieces are yours (python -m exercises serve)")
    print("One stage of your engine in detail: python -m exercises my_engine 3\n")
    return all(r.status == "pass" for rs in results.values() for r in rs)


def my_engine_main(argv: list[str]) -> int:
    """``python -m exercises my_engine [STAGE] [--root DIR]``: check your engine's modules."""
    from minipaged.course import my_engine

    parser = argparse.ArgumentParser(
        prog="python -m exercises my_engine",
        description="Check your engine (my_engine/stageN_*.py) against the package: core and stretch, "
        "each case that fails with what was expected and the likely mistake.",
    )
    parser.add_argument("stage", nargs="?", type=_stage, help="0 .. 6; every stage if left out")
    parser.add_argument("--root", type=Path, help="the folder holding my_engine/ (default: here or a folder above)")
    args = parser.parse_args(argv)
    if args.stage is not None and args.stage not in my_engine.STAGES:
        parser.error(f"not a stage of my_engine: {args.stage} (0 .. {max(my_engine.STAGES)})")
    try:
        root = my_engine.find_root(args.root)
    except FileNotFoundError as exc:
        print(exc)
        return 2
    stages = list(my_engine.STAGES) if args.stage is None else [args.stage]
    results = {stage: my_engine.run(stage, root=root) for stage in stages}
    for stage in stages:
        print(my_engine.format_results(stage, results[stage]))
    return 0 if all(r.status == "pass" for rs in results.values() for r in rs) else 1


def serve_main(argv: list[str]) -> int:
    """``python -m exercises serve [FLAGS]``: the classroom server (``python -m minipaged serve``'s
    flags) over your engine: every piece of ``my_engine/`` whose checks pass, the package's for the rest."""
    from minipaged.course import my_engine
    from minipaged.course.my_engine.serving import learner_engine
    from minipaged.engine.llm import LLM
    from minipaged.serve import cli

    try:
        root = my_engine.find_root()
    except FileNotFoundError as exc:
        print(exc)
        return 2

    def engine(model: str | None, **engine_args: object) -> LLM:
        llm = learner_engine(model, root=root, **engine_args)
        print(llm.pieces.report(), flush=True)
        return llm

    cli.main(argv, engine=engine, prog="python -m exercises serve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
