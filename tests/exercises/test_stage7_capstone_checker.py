"""The capstone's checker: planted bugs fail with messages that point at them; the command knows it by name.

A planted bug is an edit of a few lines of one kernel in ``tests/exercises/solutions/stage7_capstone.py``
(the edited copy is written to a file: Triton reads a kernel's source). ``python -m exercises``'s
checker then runs that puzzle's checks on it: the puzzle must read FAIL, its first failing check must
say what it wanted and what came back, and the failing checks' messages must point at the mistake
(a hint line, or the loop step where it first shows). The untouched stub reads "not written yet":
``test_harness.py`` checks that for every stage, this one included.
"""

from __future__ import annotations

import ast

import pytest

from exercises import harness
from exercises.__main__ import main
from exercises.report import format_stage, verdict

STEM = "stage7_capstone"

# name -> (kernel, [(the solution's text, the text with the bug)], words the first failing check must say)
BUGS = {
    "scores-unscaled": (
        "block_scores_kernel",
        [("s = tl.sum(k * qv[None, :], axis=1) * scale", "s = tl.sum(k * qv[None, :], axis=1)")],
        ["hint: that is unscaled"],
    ),
    "scores-kv-head-ignored": (
        "block_scores_kernel",
        [("rows = (slot * num_kv_heads + kv_head) * head_dim", "rows = slot * num_kv_heads * head_dim")],
        ["KV head 1 (block_size 3", "hint: that is block 4, KV head 0's scores"],
    ),
    "scores-bf16-arithmetic": (  # no .to(tl.float32) after the loads: the interpreter's bf16 math is wrong
        "block_scores_kernel",
        [
            ("qv = tl.load(q + d, mask=d_ok, other=0.0).to(tl.float32)", "qv = tl.load(q + d, mask=d_ok, other=0.0)"),
            ("d_ok[None, :], other=0.0).to(tl.float32)", "d_ok[None, :], other=0.0)"),
        ],
        ["bfloat16", "slots [0, 1, 2"],
    ),
    "tail-off-by-one": (
        "tail_attention_kernel",
        [("t_ok, d_ok = t < n, d < head_dim", "t_ok, d_ok = t <= n, d < head_dim")],
        ["n = 1 of block_size 3", "hint: that is attention over slots 0..1"],
    ),
    "tail-masked-to-zero": (
        "tail_attention_kernel",
        [('s = tl.where(t_ok, s, float("-inf"))', "s = tl.where(t_ok, s, 0.0)")],
        ["masked slots still count in sum(p)"],
    ),
    "online-max-not-updated": (
        "online_attention_kernel",
        [("        m_i = m_new\n", "")],
        ["hint: that is attention over the last block only", "right through step 0, first wrong at step 1"],
    ),
    "online-no-rescale": (
        "online_attention_kernel",
        [("acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)", "acc = acc + tl.sum(p[:, None] * v, axis=0)")],
        ["first wrong at step 1", "the running max rises"],
    ),
    "paged-logical-block": (
        "paged_attention_kernel",
        [("block = tl.load(block_table + j)", "block = j")],
        ["hint: that is attention over blocks 0, 1, 2, ...", "first wrong at step 0: logical block 0 -> physical"],
    ),
    "gqa-h-mod-group": (
        "gqa_attention_kernel",
        [("kv_head = head // group", "kv_head = head % group")],
        ["query head 1 of 2 on 2 KV heads (group 1)", "hint: that is KV head 0's (query head 1 reads h // group = 1)"],
    ),
    "decode-table-of-sequence-0": (
        "paged_decode_kernel",
        [("table = block_tables + seq.to(tl.int64) * max_blocks", "table = block_tables")],
        ["programs (seq, head) differ: (1, 0), (1, 1)", "hint: that is sequence 0's block table"],
    ),
    "decode-context-len-of-sequence-0": (
        "paged_decode_kernel",
        [("context_len = tl.load(context_lens + seq)", "context_len = tl.load(context_lens)")],
        ["program (1, 0)", "hint: that is sequence 0's context_len"],
    ),
    "prefill-no-causal-mask": (
        "paged_prefill_kernel",
        [
            ("for j in range(0, pos // block_size + 1):", "for j in range(0, tl.cdiv(context_len, block_size)):"),
            ("(j * block_size + t <= pos)", "(j * block_size + t < context_len)"),
        ],
        ["hint: that is no causal mask: every new token sees the whole context"],
    ),
    "prefill-mask-without-offset": (
        "paged_prefill_kernel",
        [("pos = context_len - q_len + i", "pos = i")],
        ["new tokens at positions 7..12", "hint: that is the mask at position i = 0, not context_len - q_len + i = 7"],
    ),
}


def plant(kernel: str, edits: list[tuple[str, str]], folder) -> object:
    """The reference solution with ``edits`` made inside ``kernel`` only (each text must occur there once)."""
    source = (harness.SOLUTIONS / f"{STEM}.py").read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == kernel)
    lines = source.splitlines(keepends=True)
    start, end = node.lineno - 1, node.end_lineno
    body = "".join(lines[start:end])
    for old, new in edits:
        assert body.count(old) == 1, f"{old!r} is not once in {kernel}: update the planted bug with the solution"
        body = body.replace(old, new)
    path = folder / f"{STEM}.py"
    path.write_text("".join(lines[:start]) + body + "".join(lines[end:]))
    return harness.load_file(path, f"planted_{STEM}_{folder.name}")


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_bug_fails_with_a_pointing_message(bug, tmp_path):
    kernel, edits, says = BUGS[bug]
    (report,) = harness.check({7: plant(kernel, edits, tmp_path)}, only={kernel})
    exercise = report.exercise(kernel)
    assert exercise.status == "fail", [(c.name, c.outcome, c.message) for c in exercise.checks]
    failing = exercise.failing()
    said = "\n\n".join(c.message for c in failing)
    for words in says:
        assert words in said, f"{words!r} not in the messages of the failing checks:\n{said}"
    first = failing[0]
    assert "want" in first.message and "got" in first.message, first.message
    assert any(w.startswith(f"check: tests/exercises/test_{STEM}.py:") for w in first.where), first.where
    assert verdict(report) == f"stage 7: 0 of 1 exercises pass; failing: {kernel}"
    assert f"FAIL {kernel} · check {first.name}" in format_stage(report)


def test_the_command_knows_the_capstone(capsys):
    """``python -m exercises capstone`` is stage 7; one puzzle of the reference solution, through --file."""
    solution = harness.SOLUTIONS / f"{STEM}.py"
    assert main(["capstone", "block_scores_kernel", "--file", str(solution)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"stage 7 · tests/exercises/solutions/{STEM}.py · notebook 04_triton_kernel"), out
    assert out.rstrip().endswith("stage 7: all 5 checks pass"), out
