"""How much of the package one engine step runs through (scripts/step_trace.py), in a fresh process.

One prefill step and one decode step, traced with ``sys.setprofile``: the files, lines and
functions of the package they enter, printed for the record. No count is held to a budget: a file
is a noun with one job, and a budget on their number only merges nouns.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_one_prefill_and_one_decode_step_are_traced_through_the_steps_modules():
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "step_trace.py"), "--list"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=True,
    )  # fmt: skip
    m = re.match(r"(\d+) files, (\d+) lines, (\d+) functions \((\d+) with comprehensions\)", run.stdout)
    assert m, run.stdout
    files, lines, functions, with_comprehensions = map(int, m.groups())
    listed = [line.split(":")[0].strip() for line in run.stdout.splitlines()[1:]]
    assert len(listed) == files and all(p.startswith("minipaged/") for p in listed)
    # the step's own work is there: scheduling, the transaction, the runner, stage 3's slot mapping,
    # the model's weight products
    step = ("engine/scheduler.py", "engine/step_transaction.py", "engine/model_runner.py", "kv/slot_mapping.py")
    for module in (*step, "model/products.py"):
        assert f"minipaged/{module}" in listed
    assert 0 < functions <= with_comprehensions and lines > 0
