"""``python -m minipaged demo``: real chats sharing a system prompt, then the copy model's check."""

from __future__ import annotations

import re

import pytest

from minipaged.__main__ import main
from minipaged.cli.demo import QUESTIONS, kv_waste
from minipaged.engine.outputs import CompletionOutput, RequestOutput


def finished(num_prompt: int, num_output: int) -> RequestOutput:
    return RequestOutput(0, None, [1] * num_prompt, [CompletionOutput(0, "", [2] * num_output, "stop")])


def test_kv_waste_counts_whole_blocks_and_shared_ones_once():
    outs = [finished(40, 8), finished(40, 10)]  # 48 and 50 tokens: 3 and 4 blocks of 16
    line = kv_waste(outs, block_size=16, max_model_len=1000, shared_blocks=2)
    assert "98 tokens. Paged allocates 112 (12.5% waste" in line
    assert "; 80 slots with the shared blocks stored once" in line  # 7 blocks, the 2 shared stored once: 5
    assert "Contiguous would reserve 2000 (95.1% waste at max_model_len=1000)" in line


@pytest.mark.slow
def test_the_demo_chats_share_the_system_prompt_and_copies_exactly(real_model, capsys):
    main(["demo", "--model", real_model, "--num-chats", "3", "--max-tokens", "12", "--num-prompts", "4"])
    out = capsys.readouterr().out
    chats, copies = out.split("Part 2:")
    for i, question in enumerate(QUESTIONS[:3], 1):
        assert f"[{i}] {question}" in chats
    assert "[1] What is the capital of France? Answer in one sentence.\n    The capital of France is Paris.\n" in chats
    cached = [int(c) for c in re.findall(r"prompt tokens, (\d+) from the prefix cache", chats)]
    assert cached[0] == 0 and cached[1] == cached[2] > 0  # the others reuse the first one's blocks
    pattern = (
        r"Their (\d+) full blocks \((\d+) tokens\) are stored once, as physical blocks (\[.*?\]) "
        r"with ref_cnt (\[.*?\]) after the first step: 3 of the 3 chats' block tables"
    )
    shared = re.search(pattern, chats)
    assert shared is not None, chats
    num_blocks = int(shared.group(1))
    common = int(re.search(r"are the first (\d+) tokens of every chat", chats).group(1))
    assert num_blocks == common // 16 >= 3 and int(shared.group(2)) == 16 * num_blocks == cached[1]
    assert shared.group(4) == str([3] * num_blocks)
    assert "Paged allocates" in chats and "at max_model_len=8192" in chats
    assert "4/4 completions exact" in copies
