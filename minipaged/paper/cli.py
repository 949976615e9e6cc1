"""``python -m minipaged paper [NAME ...] [--quick] [--out DIR]``: run figures, print them, save JSON."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from minipaged.paper.registry import FIGURES, run

DEFAULT_OUT = Path("docs/paper")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", metavar="NAME", help=f"all (the default), or some of: {', '.join(FIGURES)}")
    p.add_argument("--quick", action="store_true", help="small sizes: about 2 minutes for all, not the figures")
    p.add_argument("--out", default=None, help=f"folder for NAME.json (default {DEFAULT_OUT}; quick: NAME.quick.json)")
    p.add_argument("--config", nargs="*", default=[], help="config.json files for kv-bytes to size as well")


def main(args: argparse.Namespace) -> list[str]:
    """Run the figures ``args.names`` asks for; returns the paths written."""
    names = list(FIGURES) if not args.names or args.names == ["all"] else args.names
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise SystemExit(f"unknown figure {unknown[0]!r}: choose from all, {', '.join(FIGURES)}")
    out = Path(args.out) if args.out else DEFAULT_OUT
    written = []
    for name in names:
        start = time.perf_counter()
        overrides = {"configs": args.config} if name == "kv-bytes" and args.config else {}
        result = run(name, quick=args.quick, **overrides)
        result.print()
        path = result.save(out)
        written.append(str(path))
        print(f"  ({time.perf_counter() - start:.0f} s; saved {path})")
    return written
