"""``python -m minipaged course OUT_DIR``: the learner's copy has no outputs, blank guesses, stub exercises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minipaged.__main__ import main
from minipaged.course.learner import blank_guess, is_guess_cell, make_learner_copy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("course") / "my-course"
    make_learner_copy(out)
    return out


def test_blank_guess_keeps_the_comment():
    assert blank_guess("my_guess = [5, 6, 7]  # your guess: D's blocks") == "my_guess = None  # your guess: D's blocks"
    assert blank_guess("my_guess = ('a', '#')  # your guess: x") == "my_guess = None  # your guess: x"
    assert blank_guess("my_guess = 3") == "my_guess = None"


def test_a_filled_guess_is_blanked(tmp_path):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "exercises").mkdir()
    nb = nbformat.v4.new_notebook()
    guess = nbformat.v4.new_code_cell("my_guess = 1024  # your guess: bytes per token")
    guess.outputs = [nbformat.v4.new_output("stream", text="x\n")]
    guess.execution_count = 3
    nb.cells = [nbformat.v4.new_markdown_cell("**Predict:** ..."), guess, nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, repo / "notebooks" / "00_test.ipynb")
    make_learner_copy(tmp_path / "out", repo=repo)
    got = nbformat.read(tmp_path / "out" / "notebooks" / "00_test.ipynb", as_version=4).cells
    assert got[1].source == "my_guess = None  # your guess: bytes per token"
    assert got[1].outputs == [] and got[1].execution_count is None
    assert got[2].source == "x = 1"


def test_notebooks_have_no_outputs_and_blank_guesses(copy):
    names = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    assert sorted(p.name for p in (copy / "notebooks").glob("*.ipynb")) == names and len(names) == 8
    for name in names:
        nb = nbformat.read(copy / "notebooks" / name, as_version=4)
        assert "widgets" not in nb.metadata, name
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.outputs == [] and c.execution_count is None for c in code), name
        guesses = [c for c in code if is_guess_cell(c)]
        assert len(guesses) >= 4 and all(c.source.startswith("my_guess = None  # your guess: ") for c in guesses)
        committed = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        assert [c.source for c in nb.cells] == [c.source for c in committed.cells], name  # the text is untouched


def test_exercises_are_the_stubs_without_solutions(copy):
    got = sorted(p.relative_to(copy / "exercises").as_posix() for p in (copy / "exercises").rglob("*") if p.is_file())
    want = sorted(
        p.relative_to(ROOT / "exercises").as_posix()
        for p in (ROOT / "exercises").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert got == want
    assert not (copy / "tests").exists() and not list(copy.rglob("solutions"))
    for stub in (copy / "exercises").glob("stage*.py"):
        assert "raise NotImplementedError" in stub.read_text(encoding="utf-8"), stub.name


def test_my_engine_is_the_stubs_and_its_checks_run_in_the_copy(copy):
    from minipaged.course import my_engine

    got = sorted(p.name for p in (copy / "my_engine").glob("*.py"))
    assert got == sorted(p.name for p in (ROOT / "my_engine").glob("*.py")) and len(got) == 1 + len(my_engine.STAGES)
    for name in got:
        assert (copy / "my_engine" / name).read_text(encoding="utf-8") == (ROOT / "my_engine" / name).read_text(
            encoding="utf-8"
        )
    assert not list(copy.rglob("my_engine_solutions"))
    # the notebooks' closing cells run from notebooks/: the engine is found in the folder above
    assert my_engine.find_root(copy / "notebooks") == copy
    results = my_engine.run(1, root=copy)
    assert results and all(r.status == "todo" for r in results), results


@pytest.mark.slow
def test_the_checker_runs_in_the_copy(copy):
    """``python -m exercises stage2`` in the copy checks the copy's file with the repository's checks."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "exercises", "stage2"], cwd=copy, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "physical  not written yet" in done.stdout and "stage 2: not written yet" in done.stdout


def test_the_command_refuses_a_folder_in_use(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="minipaged course: .* is not empty: name a new folder"):
        main(["course", str(tmp_path)])  # a message, not a traceback
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_command_writes_the_copy(tmp_path, capsys):
    main(["course", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "files written to" in out and (tmp_path / "out" / "notebooks" / "05_scheduler.ipynb").exists()


@pytest.mark.slow
def test_the_copy_filled_with_the_solutions_passes_and_serves_real_chats_as_the_engine_does(tmp_path):
    """A learner who wrote every stage: in a fresh process, inside the copy, every check passes and
    their engine, every piece theirs, answers real chats with the package engine's tokens (fp32)."""
    out = tmp_path / "my-course"
    make_learner_copy(out)
    for solution in (ROOT / "tests" / "course" / "my_engine_solutions" / "my_engine").glob("*.py"):
        (out / "my_engine" / solution.name).write_text(solution.read_text(encoding="utf-8"), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    checks = subprocess.run(
        [sys.executable, "-m", "exercises", "my_engine"], cwd=out, env=env, capture_output=True, text=True, timeout=600
    )
    assert checks.returncode == 0, checks.stdout + checks.stderr
    assert checks.stdout.count("core done; stretch") == 7
    assert "FAIL" not in checks.stdout and "TODO" not in checks.stdout
    script = """
from minipaged import LLM
from minipaged.course.my_engine.serving import compare, learner_engine
kw = dict(dtype="float32", enable_prefix_caching=True, num_kvcache_blocks=6, max_num_batched_tokens=64)
mine = learner_engine("smollm2-135m-instruct", **kw)
assert not mine.pieces.package, mine.pieces.report()
chats = [[{"role": "user", "content": q}] for q in ("What is paged memory?", "Name two colours.")]
result = compare(mine, LLM("smollm2-135m-instruct", **kw), chats, max_tokens=12)
assert result.first_difference is None, result
print("served", sum(map(len, result.yours)), "tokens; calls:", sorted(mine.pieces.calls))
"""
    served = subprocess.run(
        [sys.executable, "-c", script], cwd=out / "notebooks", env=env, capture_output=True, text=True, timeout=600
    )
    assert served.returncode == 0, served.stdout + served.stderr
    assert served.stdout.startswith("served ") and "paged_decode_attention" in served.stdout  # EOS may end one early
