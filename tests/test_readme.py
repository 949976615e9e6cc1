"""The README's Python examples run as a user runs them: each block in a fresh interpreter, and
what its ``# comment`` lines after a ``print`` promise is what it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def promised(code: str) -> list[str]:
    """Lines the block says it prints: the comment lines right after a ``for`` loop that prints,
    and a ``print(...)  # 'text'`` line's quoted text."""
    lines = code.splitlines()
    out = []
    for i, line in enumerate(lines):
        quoted = re.match(r"print\(.*\)\s+# '(.*)'$", line)
        if quoted:
            out.append(quoted.group(1))
        if line.startswith("# ") and i and (lines[i - 1].startswith(("    print", "# "))):
            out.append(line[2:])
    return out


def test_the_readme_has_both_examples():
    assert len(BLOCKS) >= 2 and any("smollm2-135m-instruct" in b for b in BLOCKS)
    paris, colors = "The capital of France is Paris.", "The primary colors are: red, blue, and yellow."
    assert promised(BLOCKS[0]) == [paris, colors] and promised(BLOCKS[1]) == ["hello blocks"]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_example_prints_what_it_says(index):
    code = BLOCKS[index]
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    printed = run.stdout.splitlines()
    for line in promised(code):
        assert line in printed, (line, printed)


def test_nothing_broken_is_installed():
    """After the README's commands (and the model's download, which takes the GGUF out of its
    wheel without installing the wheel or its compiled dependencies), pip finds every
    requirement met."""
    run = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
