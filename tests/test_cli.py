"""The command line: ``python -m minipaged demo | eval | bench ...`` prints its figures."""

from __future__ import annotations

import pytest

from minipaged.__main__ import main


def test_demo_serves_the_embedded_model(capsys):
    main(["demo", "--num-prompts", "6"])
    out = capsys.readouterr().out
    assert "6/6 completions exact" in out
    assert "from the prefix cache" in out and "paged allocates" in out


def test_bench_memory_prints_the_comparison(capsys):
    main(["bench", "memory", "--requests", "40", "--slots", "2048", "--max-seq-len", "256"])
    out = capsys.readouterr().out
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "paged, 128 blocks of 16" in lines and "contiguous, reserve max_seq_len" in lines


def test_bench_prefix_meets_the_sharing_targets(capsys):
    """16 requests sharing a 512-token preamble: prefill tokens and peak blocks both fall by > 85%."""
    from minipaged.bench.prefix import shared_preamble

    f = shared_preamble(num_requests=16, preamble_len=512, block_size=16, seed=3)
    assert 1 - f[True]["prefill"] / f[False]["prefill"] > 0.85
    assert 1 - f[True]["peak_blocks"] / f[False]["peak_blocks"] > 0.85


def test_unknown_command_is_rejected():
    with pytest.raises(SystemExit):
        main(["serve"])
