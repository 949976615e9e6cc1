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
from minipaged.chat import ChatSession, figure
from minipaged.engine.outputs import CompletionOutput, RequestOutput

FIGURE = re.compile(r"\[(stopped; )?(\d+) prompt tokens, (\d+) from the prefix cache\]")
TIMEOUT = 600  # seconds: a busy 2-core machine decodes a token a second or slower


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
    llm = LLM(real_model, enable_prefix_caching=True)
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
    pexpect = pytest.importorskip("pexpect")
    command = chat_command(real_model, "--max-tokens", "200")
    env = {**os.environ, "TERM": "dumb"}
    # As a terminal starts it: with Ctrl-C's default action, even when these tests run from a shell
    # that ignores SIGINT (a background job does), which the chat would inherit.
    child = pexpect.spawn(
        command[0], command[1:], env=env, encoding="utf-8", timeout=TIMEOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        child.expect_exact("you> ")
        stopped = False
        for _ in range(3):
            child.sendline("Write a long story about a cat who lives in a library.")
            child.expect(r"model> \S+ \S+ \S+")  # a few words of the answer have been streamed
            child.kill(signal.SIGINT)  # what Ctrl-C in a terminal sends (a ^C byte can be lost in a busy pty)
            child.expect(FIGURE)
            stopped = child.match.group(1) == "stopped; "
            if stopped:
                break
            # On a machine too busy to read the stream while it came, the whole answer was out
            # before the Ctrl-C: it reaches the prompt instead, which says how to leave (or, sent
            # as the prompt was being drawn, it is not seen at all). Again.
            child.expect_exact("you> ")
            if child.expect_exact(["leaves)", pexpect.TIMEOUT], timeout=10) == 0:
                child.expect_exact("you> ")
        assert stopped, "three answers ran to their end through a Ctrl-C"
        child.expect_exact("you> ")
        child.sendline("What is the capital of France?")
        child.expect(FIGURE)
        assert child.match.group(1) is None  # this answer ran to its end
        assert int(child.match.group(3)) >= 16  # the first turn's blocks served the second
        assert "Paris" in child.before
        child.expect_exact("you> ")
        child.sendeof()  # Ctrl-D leaves
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
