"""How much of the package one engine step runs through: ``python scripts/step_trace.py``.

Traces ``LLM.step()`` with ``sys.setprofile`` over one prefill step and one decode step (the
embedded copy model, torch backend, prefix caching on, two requests that share a prompt's first
block) and prints the package files entered, their lines, and the functions called (with and
without comprehensions, generator expressions and lambdas). ``--list`` names them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import FrameType

import minipaged
from minipaged import LLM, SamplingParams

PACKAGE = Path(minipaged.__file__).parent
ANONYMOUS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>")


def trace_steps(llm: LLM, steps: int) -> set[tuple[str, int, str]]:
    """(file, first line, name) of every package function called during ``steps`` calls of ``llm.step()``."""
    seen: set[tuple[str, int, str]] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(str(PACKAGE)):
                seen.add((code.co_filename, code.co_firstlineno, code.co_qualname))

    for _ in range(steps):
        sys.setprofile(profile)
        try:
            llm.step()
        finally:
            sys.setprofile(None)
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="name every file and function")
    args = ap.parse_args()
    llm = LLM(attention_backend="torch", enable_prefix_caching=True, num_kvcache_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=4)
    llm.step()  # warm-up request, so that lazy imports are not counted
    for prompt in ("the quick brown fox<copy>jumps<end>", "the quick brown fox<copy>runs<end>"):
        llm.add_request(prompt, params)
    seen = trace_steps(llm, 2)  # the prefill step, then a decode step
    files = sorted({f for f, _, _ in seen})
    named = {s for s in seen if not s[2].endswith(ANONYMOUS)}
    lines = sum(len(Path(f).read_text().splitlines()) for f in files)
    print(f"{len(files)} files, {lines} lines, {len(named)} functions ({len(seen)} with comprehensions)")
    if args.list:
        for f in files:
            names = sorted(q for ff, _, q in named if ff == f)
            print(f"  {Path(f).relative_to(PACKAGE.parent)}: {', '.join(names)}")


if __name__ == "__main__":
    main()
