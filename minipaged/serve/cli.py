"""``python -m minipaged serve [MODEL | --copy-model] [--host H] [--port P] [engine args]``: start the server.

The model is the real chat model (:data:`~minipaged.model.hub.DEFAULT_CHAT_MODEL`) unless told
otherwise: ``--copy-model`` serves the embedded copy model, ``MODEL`` any other (a folder, or
``random:NAME``). A chat model's chats start with the lesson's system prompt (``--preamble FILE``,
else :data:`~minipaged.serve.inputs.LESSON_SYSTEM_PROMPT`), and prefix caching is on unless
``--no-enable-prefix-caching`` or ``--kv-layout contiguous``: every student's request then holds
the same first blocks, drawn on the projector as shared.

Every ``LLM`` keyword is a flag, spelled as vLLM spells its own (underscores as dashes:
``--max-model-len``, ``--num-kvcache-blocks``, ``--enable-prefix-caching``, ``--kv-layout``);
the flags are made from :class:`~minipaged.engine.config.EngineConfig`'s fields, so a new engine
setting gets its flag without a change here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine is imported when the server starts, after the flags are read
    from minipaged.engine.llm import LLM

ENGINE_HELP = {
    "block_size": "tokens per KV block",
    "num_kvcache_blocks": "KV pool size in blocks (default: from --kv-cache-memory)",
    "kv_cache_memory": "KV pool budget in bytes, when --num-kvcache-blocks is not given",
    "max_num_seqs": "sequences run together in one step at most",
    "max_num_batched_tokens": "tokens computed in one step at most (longer prompts are prefilled in chunks)",
    "max_model_len": "prompt + output tokens of one sequence at most (default: the model's)",
    "enable_prefix_caching": "share the K/V of prompt prefixes already computed (stage 6)",
    "attention_backend": "reference | torch | triton | auto",
    "kv_layout": "paged, or contiguous (stage 0's max_model_len reservation, to compare)",
}


def _engine_flags(parser: argparse.ArgumentParser) -> list[str]:
    """One flag per EngineConfig field; returns the field names."""
    from minipaged.engine.config import EngineConfig

    group = parser.add_argument_group("engine (the keywords of minipaged.LLM)")
    group.add_argument(
        "--dtype",
        default=argparse.SUPPRESS,
        help="auto (default: bf16 products and KV cache where the CPU multiplies bf16), float32, bfloat16, float16",
    )
    group.add_argument("--device", default=argparse.SUPPRESS, help="cpu or cuda (default: cuda if available)")
    names = []
    for f in dataclasses.fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{ENGINE_HELP.get(f.name, f.name)} (default: {f.default})"
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if kind == "bool":
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text)
        else:
            conv = int if kind.startswith("int") else float if kind.startswith("float") else str
            group.add_argument(flag, type=conv, default=argparse.SUPPRESS, metavar=f.name.upper(), help=help_text)
        names.append(f.name)
    return names


def build_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    from minipaged.model.hub import DEFAULT_CHAT_MODEL
    from minipaged.serve.limits import PER_CLIENT_OFF_LOOPBACK, Limits

    d = Limits()
    p = argparse.ArgumentParser(
        prog="python -m minipaged serve",
        description="An OpenAI-compatible HTTP server over the engine, with a live projector page (/) and a "
        "page for students (/try). See docs/serving.md and docs/teaching.md.",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "model", nargs="?", default=None, help=f"a model folder, or random:NAME (default: {DEFAULT_CHAT_MODEL})"
    )
    which.add_argument("--copy-model", action="store_true", help="serve the embedded copy model (tiny-copy) instead")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--join-code", help="the code every request must carry (made up and printed if --host is not loopback)"
    )
    p.add_argument(
        "--preamble",
        type=Path,
        metavar="FILE",
        help="the lesson's shared prompt: a chat model's system message (default: a lesson prompt of about "
        "100 tokens), or put before every text prompt for a model that cannot chat (default: none)",
    )
    p.add_argument("--served-model-name", help="the model's name in the API (default: the model folder's name)")
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="413 above (default: %(default)s)")
    lim.add_argument("--max-prompt-tokens", type=int, help="400 above (default: max_model_len - 1)")
    lim.add_argument("--max-tokens-cap", type=int, default=d.max_tokens, help="400 above (default: %(default)s)")
    lim.add_argument(
        "--max-requests-per-client",
        type=int,
        help=f"429 above; 0 = no cap (default: {PER_CLIENT_OFF_LOOPBACK} off loopback, no cap on loopback)",
    )
    lim.add_argument(
        "--max-queued-requests", type=int, default=d.max_queued_requests, help="503 above (default: %(default)s)"
    )
    return p, _engine_flags(p)


def served_name(model: str | None) -> str:
    """The model's name in the API: a folder's or file's name, else what it was called by."""
    from minipaged.model.loader import EMBEDDED_MODEL_DIR

    if model is None:
        return EMBEDDED_MODEL_DIR.name
    path = Path(model)
    return path.name if path.is_dir() else path.stem if path.is_file() else model


def main(argv: list[str], engine: Callable[..., LLM] | None = None, prog: str | None = None) -> None:
    """Serve; ``engine(model, **engine_args)`` builds the engine (default: :class:`LLM`), e.g.
    ``python -m exercises serve`` builds the learner's (:mod:`minipaged.course.my_engine.serving`)."""
    parser, engine_names = build_parser()
    if prog is not None:
        parser.prog = prog
    args = parser.parse_args(argv)
    try:
        # Each library by name: minipaged.serve.app, once imported, would not import them again.
        for library in ("fastapi", "uvicorn", "httpx", "prometheus_client"):
            importlib.import_module(library)
        import uvicorn

        from minipaged.serve.app import create_app
    except ImportError as e:
        parser.error(f'the server needs its libraries ({e.name} is missing): pip install -e ".[serve]"')
    from minipaged.engine.llm import LLM
    from minipaged.model.hub import DEFAULT_CHAT_MODEL
    from minipaged.serve.access import is_loopback, new_join_code
    from minipaged.serve.inputs import LESSON_SYSTEM_PROMPT
    from minipaged.serve.limits import Limits
    from minipaged.serve.protocol import APIError

    engine_args = {k: getattr(args, k) for k in [*engine_names, "dtype", "device"] if hasattr(args, k)}
    if engine_args.get("kv_layout", "paged") == "paged":  # the shared blocks are the lesson's point
        engine_args.setdefault("enable_prefix_caching", True)
    model = None if args.copy_model else args.model or DEFAULT_CHAT_MODEL
    try:
        preamble = args.preamble.read_text() if args.preamble else None
        llm = (engine or LLM)(model, **engine_args)
    except (OSError, ValueError, TypeError) as e:
        default = model == DEFAULT_CHAT_MODEL and isinstance(e, OSError)
        hint = " (or --copy-model: the embedded copy model, nothing to fetch)" if default else ""
        parser.error(f"{e}{hint}")
    if preamble is None and llm.tokenizer is not None and llm.tokenizer.chat_template is not None:
        preamble = LESSON_SYSTEM_PROMPT
    name = args.served_model_name or served_name(model)
    loopback = is_loopback(args.host)
    join_code = args.join_code or (None if loopback else new_join_code())
    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        max_tokens=args.max_tokens_cap,
        max_requests_per_client=args.max_requests_per_client,
        max_queued_requests=args.max_queued_requests,
    )
    try:
        app = create_app(llm, model_name=name, limits=limits, loopback=loopback, join_code=join_code, preamble=preamble)
    except APIError as e:  # the lesson's prompt itself is refused, e.g. longer than --max-prompt-tokens
        parser.error(f"--preamble: {e.message}")
    shown = "THIS-MACHINE'S-ADDRESS" if args.host in ("0.0.0.0", "::") else args.host
    base = f"http://{shown}:{args.port}"
    code = f"?code={join_code}" if join_code else ""
    stats = llm.kv_stats()
    caching = ", prefix caching" if llm.config.enable_prefix_caching else ""
    print(
        f"minipaged serve: {name}, {stats['kv_layout']} KV cache of {llm.num_blocks} blocks x {llm.block_size}{caching}"
    )
    print(f"  projector: {base}/{code}")
    print(f"  students:  {base}/try{code}")
    print(f"  API:       {base}/v1  (openai client: base_url='{base}/v1', api_key='{join_code or 'any'}')")
    if join_code:
        print(f"  join code: {join_code}")
    sys.stdout.flush()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
