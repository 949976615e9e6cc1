"""Benchmarks that print the figures quoted in docs/: ``python -m minipaged bench WHICH`` (see ``BENCHES``)."""

from __future__ import annotations

import argparse
import re


def parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The bench's argument parser; its ``--help`` shows the module docstring as plain text."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc)  # :func:`x` -> x
    text = re.sub(r"``([^`]+)``", r"\1", text).replace("**", "")
    return argparse.ArgumentParser(
        prog=f"python -m minipaged bench {name}", description=text, formatter_class=argparse.RawDescriptionHelpFormatter
    )
