"""``python -m minipaged serve``: the real model by default (the copy model one flag away), prefix
caching on, one flag per engine keyword, and a join code off loopback."""

from __future__ import annotations

import re

import httpx
import pytest
import uvicorn
from serve.harness import ServerThread

import minipaged.engine.llm
from minipaged.__main__ import main
from minipaged.model.hub import DEFAULT_CHAT_MODEL

ENGINE_FLAGS = ["--max-model-len", "--num-kvcache-blocks", "--max-num-seqs", "--enable-prefix-caching", "--kv-layout"]


def test_help_lists_every_engine_flag_and_limit(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("usage: python -m minipaged serve")
    for flag in [*ENGINE_FLAGS, "--block-size", "--dtype", "--host", "--port", "--join-code", "--preamble"]:
        assert flag in out
    for flag in ["--max-body-bytes", "--max-prompt-tokens", "--max-tokens-cap", "--max-requests-per-client"]:
        assert flag in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--kv-layout", "ring"], "kv_layout must be one of"),
        (["--num-kvcache-blocks", "0"], "num_kvcache_blocks must be >= 1"),
        (["--kv-layout", "contiguous", "--enable-prefix-caching"], "prefix caching needs kv_layout='paged'"),
        (["--max-num-seqs", "many"], "invalid int value"),
        (["--preamble", "/no/such/file"], "No such file"),
    ],
)
def test_bad_engine_arguments_exit_2_and_say_why(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_off_loopback_a_join_code_is_made_up_printed_and_required(monkeypatch, capsys):
    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, host, port, **kw: served.update(app=app, host=host, port=port))
    main(["serve", "--copy-model", "--host", "0.0.0.0", "--port", "8123", "--num-kvcache-blocks", "32",
          "--max-model-len", "256"])  # fmt: skip
    out = capsys.readouterr().out
    code = re.search(r"join code: (\w+)", out).group(1)
    assert f"/try?code={code}" in out and served["host"] == "0.0.0.0" and served["port"] == 8123
    with ServerThread(served["app"]) as s:  # the same app, served on loopback for the test
        assert httpx.get(f"{s.url}/v1/models", timeout=30).status_code == 401
        models = httpx.get(f"{s.url}/v1/models", headers={"Authorization": f"Bearer {code}"}, timeout=30).json()
        assert models["data"][0]["id"] == "tiny-copy" and models["data"][0]["max_model_len"] == 256
        config = httpx.get(f"{s.url}/projector/config", headers={"Authorization": f"Bearer {code}"}, timeout=30).json()
    # the copy model cannot chat: no system prompt, text prompts as they come
    assert config["chat"] is False and config["preamble"] is None and config["preamble_tokens"] == 0
    assert served["app"].state.server.llm.config.enable_prefix_caching  # on by default


class Loaded(Exception):
    pass


@pytest.mark.parametrize(
    "argv,model,caching",
    [
        ([], DEFAULT_CHAT_MODEL, True),
        (["--copy-model"], None, True),
        (["/some/folder", "--kv-layout", "contiguous"], "/some/folder", None),
        (["random:llama-tiny", "--no-enable-prefix-caching"], "random:llama-tiny", False),
    ],
)
def test_the_real_model_by_default_the_copy_model_one_flag_away(argv, model, caching, monkeypatch, capsys):
    asked = {}

    def record(model=None, **engine_args):
        asked.update(model=model, caching=engine_args.get("enable_prefix_caching"))
        raise Loaded

    monkeypatch.setattr(minipaged.engine.llm, "LLM", record)
    with pytest.raises(Loaded):
        main(["serve", *argv])
    assert asked == {"model": model, "caching": caching}


def test_a_model_and_the_copy_model_together_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "/some/folder", "--copy-model"])
    assert exit_.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_a_preamble_over_the_prompt_limit_exits_2(tmp_path, capsys):
    lesson = tmp_path / "lesson.txt"
    lesson.write_text("a lesson prompt longer than the limit " * 2)  # 76 bytes + <copy>a<end>: 79 tokens
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--copy-model", "--preamble", str(lesson), "--max-prompt-tokens", "40"])
    assert (
        exit_.value.code == 2
        and "--preamble: prompt: 79 tokens, over the server's limit of 40" in capsys.readouterr().err
    )
