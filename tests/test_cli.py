"""The command line, ``python -m minipaged demo | chat | eval | serve | bench | ...``: parsing, help, dispatch.

The benches' own figures are tested in ``tests/bench/test_bench.py``; the animations in
``tests/viz/test_animate.py``; the demo and the chat with the real model in ``tests/test_demo.py`` and
``tests/test_chat.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from minipaged.__main__ import BENCHES, main

COMMANDS = ["demo", "chat", "eval", "serve", "bench", "animate", "course", "slides", "paper", "download"]


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``main(argv)``; 0 when it returns normally."""
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv", [[], *([c] for c in COMMANDS), *(["bench", b] for b in BENCHES)], ids=lambda a: " ".join(a) or "top"
)
def test_help_exits_0_and_prints_usage(argv, capsys):
    code, out, _ = run_main([*argv, "--help"], capsys)
    assert code == 0
    prog = " ".join(["python -m minipaged", *argv])
    assert out.startswith(f"usage: {prog}"), out[:200]
    assert "--help" in out


def test_top_level_help_lists_every_command(capsys):
    _, out, _ = run_main(["--help"], capsys)
    for command in COMMANDS:
        assert command in out


def test_bench_help_names_every_bench(capsys):
    _, out, _ = run_main(["bench", "--help"], capsys)
    for bench in BENCHES:
        assert bench in out


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_help_is_plain_text(bench, capsys):
    """A bench's ``--help`` shows its docstring without reStructuredText markup."""
    _, out, _ = run_main(["bench", bench, "--help"], capsys)
    assert "``" not in out
    assert not re.search(r":(func|mod|class|meth|data|attr):`", out), out
    assert "**" not in out
    assert len(out.splitlines()) > 8, "the help shows what the bench measures, not only its options"


BAD = {
    "no command": [],
    "unknown command": ["train"],
    "unknown bench": ["bench", "latency"],
    "bench without a name": ["bench"],
    "unknown demo option": ["demo", "--bogus"],
    "zero prompts": ["demo", "--num-prompts", "0"],
    "not a number": ["demo", "--num-prompts", "many"],
    "more chats than questions": ["demo", "--num-chats", "9"],
    "a negative temperature": ["chat", "--temperature", "-1"],
    "no answer at all": ["chat", "--max-tokens", "0"],
    "animate without --out": ["animate", "prefix"],
    "unknown animation": ["animate", "movie", "--out", "x.gif"],
    "animation of no frames": ["animate", "prefix", "--out", "x.gif", "--max-frames", "0"],
    "animation at 0 fps": ["animate", "prefix", "--out", "x.gif", "--fps", "0"],
    "unknown bench option": ["bench", "memory", "--bogus"],
    "bench option not a number": ["bench", "memory", "--requests", "lots"],
}


@pytest.mark.parametrize("argv", BAD.values(), ids=BAD.keys())
def test_bad_arguments_exit_2_with_usage(argv, capsys):
    code, out, err = run_main(argv, capsys)
    assert code == 2
    assert "usage: python -m minipaged" in err
    assert "error:" in err
    assert out == ""


@pytest.mark.slow
def test_runs_as_a_module():
    """``python -m minipaged`` is the entry point (``minipaged/__main__.py``)."""
    done = subprocess.run(
        [sys.executable, "-m", "minipaged", "bench", "--help"], capture_output=True, text=True, timeout=600
    )  # the timeout is a hang guard: importing torch on a busy machine can take a minute
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m minipaged bench")


def test_bench_options_reach_the_bench(capsys):
    """``bench memory --requests N ...`` hands its options to the bench, which prints its table."""
    code, out, _ = run_main(["bench", "memory", "--requests", "12", "--slots", "1024", "--max-seq-len", "128"], capsys)
    assert code == 0
    assert "trace: 12 requests (seed 0)" in out and "max_seq_len 128; 1024 KV slots each" in out
    assert "paged, 64 blocks of 16" in out


@pytest.mark.slow
def test_demo_without_its_chat_model_still_checks_the_copy_model(tmp_path, capsys):
    code, out, _ = run_main(["demo", "--model", str(tmp_path / "absent"), "--num-prompts", "6"], capsys)
    assert code == 1
    assert "No chats: FileNotFoundError: model " in out and "does not exist" in out and "(pass --model" in out
    assert "6/6 completions exact" in out
    assert "from the prefix cache" in out and "Paged allocates" in out


@pytest.mark.slow
def test_eval_reports_exact_completions(capsys):
    code, out, _ = run_main(["eval", "--num-cases", "4"], capsys)
    assert code == 0
    assert "embedded model: 4/4 exact completions (100.0%)" in out


@pytest.mark.parametrize("command", ["demo", "chat", "eval", "animate", "course", "slides"])
def test_every_option_and_argument_says_what_it_is(command, capsys):
    """No bare option in ``--help``: each has a help text (argparse prints it on the same line or the next)."""
    _, out, _ = run_main([command, "--help"], capsys)
    body = out.split("options:", 1)[1] if "options:" in out else out
    args = out.split("positional arguments:", 1)[1].split("options:")[0] if "positional arguments:" in out else ""
    lines = [line for line in (args + body).splitlines() if line.strip()]
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("-") and "-h, --help" not in stripped:
            described = len(stripped.split("  ")) > 1 or (i + 1 < len(lines) and lines[i + 1].startswith(" " * 10))
            assert described, f"{command}: {stripped!r} has no help text"


def test_animate_help_says_what_each_scenario_shows(capsys):
    _, out, _ = run_main(["animate", "--help"], capsys)
    out = re.sub(r"-\s+", "-", " ".join(out.split()))  # argparse wraps lines, and breaks at hyphens
    assert "prefix:" in out and "copy-on-write" in out and "engine:" in out and "preemption" in out
