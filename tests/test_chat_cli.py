"""``python -m minipaged chat``: piped stdin, Ctrl-C in a real terminal, the conversation's prefix hits.

The chats run the real model in a fresh process each (as a user would start them): piped lines
with ``subprocess``, a terminal with ``pexpect`` (a pty; Ctrl-C is the terminal's interrupt
character, which the pty turns into SIGINT).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from minipaged import LLM, SamplingParams
from minipaged.cli.chat import ChatSession, figure
from minipaged.engine.outputs import CompletionOutput, RequestOutput

FIGURE = re.compile(r"\[(stopped; )?(\d+) prompt tokens, (\d+) from the prefix cache\]")
TIMEOUT = 600  # seconds: a hang guard for one wait (a busy 2-core machine decodes a token a second or slower)
STORY_TOKENS = 400  # the story's length, had nothing stopped it


def chat_command(real_model: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "minipaged", "chat", "--model", real_model, "--temperature", "0", *options]


def test_the_figure_after_an_answer():
    out = RequestOutput(0, None, list(range(312)), [CompletionOutput(0, "hi", [5], "stop")], num_cached_tokens=288)
    assert figure(out, stopped=False) == "[312 prompt tokens, 288 from the prefix cache]"
    assert figure(out, stopped=True) == "[stopped; 312 prompt tokens, 288 from the prefix cache]"
    assert figure(None, stopped=True) == "[stopped; no token yet]"


def test_a_model_that_cannot_chat_is_refused_at_the_start():
    with pytest.raises(ValueError, match="no chat template"):
        ChatSession(LLM(), SamplingParams(temperature=0))


@pytest.mark.slow
def test_the_oldest_exchanges_go_when_the_conversation_outgrows_the_model(real_model):
    llm = LLM(real_model, dtype="float32", enable_prefix_caching=True)
    alone = ChatSession(llm, SamplingParams(temperature=0), system="Be brief.").prompt_ids("What is a block?")
    # room for the message alone and its answer, but not for an earlier exchange as well
    session = ChatSession(llm, SamplingParams(temperature=0, max_tokens=llm.max_model_len - len(alone)), "Be brief.")
    session.history += [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"}]
    ids = session.prompt_ids("What is a block?")
    assert ids == alone
    assert session.history == [{"role": "system", "content": "Be brief."}]  # the exchange went, the system stayed
    assert len(ids) + session.params.max_tokens <= llm.max_model_len


@pytest.mark.slow
def test_piped_lines_are_a_conversation_whose_later_turns_hit_the_prefix_cache(real_model):
    lines = "What is the capital of France?\n\nAnd of Italy?\n"
    done = subprocess.run(
        chat_command(real_model, "--max-tokens", "10"), input=lines, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("you> ") == 2  # the blank line is skipped; each message echoed after the marker
    assert "you> What is the capital of France?\nmodel> The capital of France is Paris.\n" in out
    assert "model> The capital of Italy is Rome." in out  # the second turn saw the first
    (_, first, hit1), (_, second, hit2) = FIGURE.findall(out)
    assert int(hit1) == 0
    assert int(second) > int(first) and int(hit2) >= 32  # turn 1's prompt and answer filled two blocks of 16
    assert int(hit2) % 16 == 0 and int(hit2) < int(second)


@pytest.mark.slow
def test_ctrl_c_stops_the_answer_and_the_session_goes_on(real_model):
    """Three turns in a terminal: an answer, a story stopped by Ctrl-C, an answer again.

    The story (greedy) runs to ``--max-tokens`` without an end-of-sequence token: the Ctrl-C,
    sent once its first words are out, lands hundreds of tokens before its end, whatever the
    machine's speed. Every step waits for what the chat prints (its prompt, the answer's words,
    the figure after it), and the test reads on to the end of the output.
    """
    pexpect = pytest.importorskip("pexpect")
    command = chat_command(real_model, "--max-tokens", str(STORY_TOKENS))
    env = {**os.environ, "TERM": "dumb"}
    # As a terminal starts it: with Ctrl-C's default action, even when these tests run from a shell
    # that ignores SIGINT (a background job does), which the chat would inherit.
    child = pexpect.spawn(
        command[0], command[1:], env=env, encoding="utf-8", timeout=TIMEOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip

    def turn(message: str) -> re.Match:
        child.expect_exact("you> ")  # the chat waits for a message
        child.sendline(message)
        child.expect(FIGURE)
        return child.match

    try:
        first = turn("What is the capital of France?")
        assert first.group(1) is None and int(first.group(3)) == 0 and "Paris" in child.before

        child.expect_exact("you> ")
        child.sendline("Write a long story about a cat who lives in a library.")
        child.expect(r"model> \S+ \S+ \S+")  # the chat is streaming the answer: Ctrl-C now stops it
        child.kill(signal.SIGINT)  # what Ctrl-C in a terminal sends (a ^C byte can be lost in a busy pty)
        child.expect(FIGURE)
        stopped = child.match
        assert stopped.group(1) == "stopped; ", f"the story ran to its end through a Ctrl-C: {child.before[-300:]!r}"
        assert int(stopped.group(3)) >= 16  # the first turn's blocks served the second

        # its words depend on how much of the story was shown when the Ctrl-C landed: its figure is checked
        third = turn("What is the capital of France?")
        assert third.group(1) is None  # this answer ran to its end
        # the stopped exchange, with what was shown of the story, stays in the conversation: the
        # third prompt is longer than the second, and starts with it (served by the prefix cache)
        prompt = int(stopped.group(2))
        assert int(third.group(2)) > prompt and int(third.group(3)) >= 16 * (prompt // 16)

        child.expect_exact("you> ")
        child.sendeof()  # Ctrl-D leaves
        child.expect(pexpect.EOF)  # read to the end of the output
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
