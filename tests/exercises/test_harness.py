"""The learner's checker (``python -m exercises``, ``exercises/harness.py``) says where a learner stands.

An untouched stub must read "not written yet", a wrong answer must fail with a message that says
what was expected and what came back, a right one must pass. The learner's own files are never
used here: the stubs are rebuilt from them with every exercise's body put back to the stub's
``raise NotImplementedError``, so these checks hold however far a learner has got.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from exercises import harness
from exercises.__main__ import main
from exercises.report import format_stage, format_table, verdict

# Every check here runs the exercises' pytest session on stubs or variants of the solutions.
pytestmark = pytest.mark.slow

STUB_BODY = ast.parse("raise NotImplementedError").body


def exercise_names(stem: str) -> set[str]:
    """The exercises a stage's checks are marked with."""
    source = (harness.TESTS / f"test_{stem}.py").read_text()
    return {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", "") == "exercise"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def pristine_stub(stem: str, folder) -> object:
    """``exercises/<stem>.py`` with every exercise's body (each method of an exercise class) back to the stub's."""
    path = harness.EXERCISES / f"{stem}.py"
    tree = ast.parse(path.read_text())
    names = exercise_names(stem)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            functions = (
                [node]
                if isinstance(node, ast.FunctionDef)
                else [f for f in node.body if isinstance(f, ast.FunctionDef)]
            )
            for f in functions:
                f.body = f.body[:1] * (ast.get_docstring(f) is not None) + STUB_BODY
    out = folder / f"{stem}.py"
    out.write_text(ast.unparse(tree) + "\n")  # a real file: Triton reads a kernel's source
    return harness.load_file(out, f"pristine_{stem}")


def variant(path, **replace) -> object:
    """A private copy of the module at ``path`` with some names replaced (its functions see the replacements)."""
    module = harness.load_file(Path(path), f"variant_{Path(path).stem}_{'_'.join(replace)}")
    for name, value in replace.items():
        setattr(module, name, value)
    return module


def fresh_solution(stem: str, **replace) -> object:
    return variant(harness.SOLUTIONS / f"{stem}.py", **replace)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stubs")
    return {stage: pristine_stub(stem, folder) for stage, (stem, _) in harness.STAGES.items()}


@pytest.fixture(scope="module")
def stub_reports(stubs):
    """Every stage's checks on its untouched stub, in one session."""
    return {r.stage: r for r in harness.check(stubs)}


@pytest.mark.parametrize("stage", sorted(harness.STAGES))
def test_untouched_stub_is_not_written_yet(stub_reports, stage):
    report = stub_reports[stage]
    stem = harness.STAGES[stage][0]
    assert not report.error, report.error
    assert {e.name for e in report.exercises} == exercise_names(stem)
    for e in report.exercises:
        assert e.status == "todo", f"{e.name}: {e.status} {[(c.name, c.outcome, c.message) for c in e.checks]}"
        assert e.checks, f"{e.name} has no checks"
    assert verdict(report) == f"stage {stage}: not written yet"
    text = format_stage(report)
    assert text.endswith(f"stage {stage}: not written yet") and "FAIL" not in text and " pass" not in text


def test_table_of_all_stages(stub_reports):
    table = format_table(list(stub_reports.values())).splitlines()
    rows = table[1 : 1 + len(harness.STAGES)]
    assert [line.split()[0] for line in rows] == [str(s) for s in range(8)]  # stage 7 is the capstone
    assert all(line.endswith("not written yet") for line in rows), table


@triton.jit
def _store_without_the_padding_check(
    key, value, k_cache, v_cache, slot_mapping, key_stride, value_stride, D, D_PAD: tl.constexpr
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping + t)  # slot -1 is written too: one row before the cache
    cols = tl.arange(0, D_PAD)
    lanes = cols < D
    tl.store(k_cache + slot * D + cols, tl.load(key + t * key_stride + cols, mask=lanes), mask=lanes)
    tl.store(v_cache + slot * D + cols, tl.load(value + t * value_stride + cols, mask=lanes), mask=lanes)


def _preempts_nobody(waiting, running, free_blocks, block_size, max_num_seqs, max_num_batched_tokens):
    reference = harness.solution("stage5_scheduler")
    return reference.schedule(waiting, running, free_blocks + 1, block_size, max_num_seqs, max_num_batched_tokens)


# stage -> (exercise, a typical mistake, what the first failing check must say)
MISTAKES = {
    0: (
        "kv_bytes_per_token",
        lambda config, dtype: (
            2
            * config.num_hidden_layers
            * config.num_attention_heads
            * config.head_dim
            * torch.empty((), dtype=dtype).element_size()
        ),
        ["embedded model in fp32", "4096 == 1024"],
    ),
    1: ("fork", lambda pool, block_ids: list(block_ids), ["one more reference to each block"]),
    2: (
        "physical",
        lambda block_ids, block_size, pos: (pos // block_size, pos % block_size),  # logical, not physical
        ["position 0: want (7, 0), got (0, 0)"],
    ),
    3: (
        "decode_slot_mapping",
        lambda tables, lens, block_size: harness.solution("stage3_slot_mapping").decode_slot_mapping(
            tables, [n + 1 for n in lens], block_size
        ),
        ["want [55, 147], got [56, 148]"],
    ),
    4: ("store_kvcache_kernel", _store_without_the_padding_check, ["wrote outside k_cache", "slot -1"]),
    5: ("schedule", _preempts_nobody, ["want A:10\n", "got  A:10 B:20"]),
    6: (
        "evict_order",
        lambda free_queue, finished: free_queue + [b for t in finished for b in t],
        ["[5, 0, 1, 2, 3, 4] == [5, 2, 1, 0, 4, 3]"],
    ),
}


@pytest.fixture(scope="module")
def mistake_reports():
    """Each stage's solution with one typical mistake, only that exercise's checks, in one session."""
    modules = {
        stage: fresh_solution(harness.STAGES[stage][0], **{name: wrong}) for stage, (name, wrong, _) in MISTAKES.items()
    }
    return {r.stage: r for r in harness.check(modules, only={name for name, _, _ in MISTAKES.values()})}


@pytest.mark.parametrize("stage", sorted(MISTAKES))
def test_a_mistake_fails_with_a_useful_message(mistake_reports, stage):
    name, _, says = MISTAKES[stage]
    report = mistake_reports[stage]
    assert [e.name for e in report.exercises] == [name]
    exercise = report.exercise(name)
    assert exercise.status == "fail"
    first = exercise.failing()[0]
    for words in says:
        assert words in first.message + "\n".join(first.where), f"{words!r} not in:\n{first.message}\n{first.where}"
    assert any(w.startswith(f"check: tests/exercises/test_{harness.STAGES[stage][0]}.py:") for w in first.where)
    assert verdict(report) == f"stage {stage}: 0 of 1 exercises pass; failing: {name}"
    text = format_stage(report)
    assert f"FAIL {name} · check {first.name}" in text and first.message.splitlines()[0] in text


def test_mixed_stage(stubs):
    """Stage 3 with one exercise right, one not written, one wrong."""

    def gather_sequence_kv(cache, block_table, context_len):
        return cache[block_table]  # indexes blocks, not slots: the wrong shape

    solution = harness.solution("stage3_slot_mapping")
    module = variant(
        stubs[3].__file__, decode_slot_mapping=solution.decode_slot_mapping, gather_sequence_kv=gather_sequence_kv
    )
    (report,) = harness.check({3: module})
    status = {e.name: e.status for e in report.exercises}
    assert status == {"decode_slot_mapping": "pass", "prefill_slot_mapping": "todo", "gather_sequence_kv": "fail"}
    assert verdict(report) == (
        "stage 3: 1 of 3 exercises pass; failing: gather_sequence_kv; not written yet: prefill_slot_mapping"
    )
    assert "shape: want (" in report.exercise("gather_sequence_kv").failing()[0].message


def test_helper_not_written_yet_is_named(stubs):
    """The learner's gather calls their physical: while physical is a stub, gather says so."""

    def gather(cache, block_ids, num_tokens):
        return torch.stack([cache[module.physical(block_ids, cache.shape[1], pos)] for pos in range(num_tokens)])

    module = variant(stubs[2].__file__, gather=gather)
    (report,) = harness.check({2: module}, only={"gather"})
    (gather,) = report.exercises
    assert gather.status == "todo" and format_stage(report).count("physical raises NotImplementedError") == 1


def test_missing_name_and_import_error(tmp_path, stubs):
    module = fresh_solution("stage6_prefix_cache")
    del module.evict_order
    (report,) = harness.check({6: module})
    assert report.exercise("evict_order").status == "missing"
    assert "missing: evict_order" in verdict(report)
    broken = tmp_path / "broken.py"
    broken.write_text("def physical(block_ids, block_size, pos)\n    return 0\n")
    (report,) = harness.check({2: broken})
    assert "broken.py does not import" in report.error and "(line 1)" in report.error
    assert verdict(report).startswith("stage 2: ") and not report.passed


def test_an_endless_loop_is_stopped(tmp_path):
    mine = tmp_path / "stage5.py"
    mine.write_text("def schedule(*args):\n    while True:\n        pass\n")
    (report,) = harness.check({5: mine}, only={"schedule"}, timeout_s=0.2)
    first = report.exercise("schedule").failing()[0]
    assert "TimeoutError" in first.message and "endless loop" in first.message
    assert any(w.startswith("yours:") and "while True" in w for w in first.where)


def test_right_answers_pass(capsys):
    """The command on the reference solution: every check passes, exit status 0."""
    path = harness.SOLUTIONS / "stage2_block_table.py"
    assert main(["stage2", "--file", str(path)]) == 0
    out = capsys.readouterr().out
    (report,) = harness.check({2: path})
    count = sum(len(e.checks) for e in report.exercises)
    assert count > 5 and out.rstrip().endswith(f"stage 2: all {count} checks pass")


def test_the_command_in_a_fresh_process(stubs):
    """What a learner types, in a new interpreter (imports, exit status, the last line)."""
    done = subprocess.run(
        [sys.executable, "-m", "exercises", "stage1", "--file", stubs[1].__file__],
        cwd=harness.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.rstrip().endswith("stage 1: not written yet"), done.stdout + done.stderr
