"""Command line: ``python -m minipaged demo | chat | eval | serve | bench | animate | paper | course | slides |
download``."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from minipaged.model.hub import DEFAULT_CHAT_MODEL

BENCHES = ("memory", "kernels", "engine", "prefix", "serve", "chat")

# Libraries some commands import that the base install lacks, and the extra that brings each
# (pyproject.toml's optional-dependencies): course and slides need the notebooks extra, the
# server and `bench serve` the serve extra, `bench engine` and `bench chat` transformers, which
# only the test extra lists.
EXTRAS = {
    "nbstripout": "notebooks",
    "nbformat": "notebooks",
    "nbconvert": "notebooks",
    "nbclient": "notebooks",
    "jupyter_server_mathjax": "notebooks",
    "fastapi": "serve",
    "uvicorn": "serve",
    "httpx": "serve",
    "prometheus_client": "serve",
    "transformers": "test",
    "accelerate": "test",
}


# The library a bench needs, imported before it starts (a server, a model download) so that a
# missing one is named at once; its --help works without it.
BENCH_NEEDS = {"engine": "transformers", "chat": "transformers", "serve": "httpx"}


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """``pip install -e ".[extra]"`` for a library an extra brings, or None for any other module."""
    extra = EXTRAS.get((error.name or "").partition(".")[0])
    return None if extra is None else f'pip install -e ".[{extra}]"'


def evaluate(args: argparse.Namespace) -> None:
    """Accuracy of the embedded model through the batched engine (greedy)."""
    from minipaged.tiny import task

    acc, n = task.evaluate(num_cases=args.num_cases, num_kvcache_blocks=args.num_blocks)
    print(f"embedded model: {acc * n:.0f}/{n} exact completions ({100 * acc:.1f}%)")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # the server parses its own flags: one per engine keyword
        return importlib.import_module("minipaged.serve.cli").main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m minipaged", description="minipaged: paged KV memory, step by step")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="real chats sharing a system prompt, then the embedded copy model's check")
    d.add_argument("--model", default=DEFAULT_CHAT_MODEL, help=f"the chat model (default {DEFAULT_CHAT_MODEL})")
    d.add_argument(
        "--num-chats", type=int, choices=range(1, 9), metavar="N", default=8, help="chats to serve, 1-8 (default 8)"
    )
    d.add_argument("--max-tokens", type=_positive, default=48, help="new tokens a chat at most (default 48)")
    d.add_argument("--num-prompts", type=_positive, default=8, help="how many copy prompts to serve (default 8)")
    d.add_argument(
        "--num-blocks", type=_positive, default=64, help="KV blocks of 16 tokens in the copy model's pool (default 64)"
    )
    d.add_argument("--seed", type=int, default=0, help="seed of the random texts after the first four (default 0)")
    t = sub.add_parser(
        "chat",
        help="chat with a real model in the terminal: streamed answers, prefix-cache figures a turn",
        description="A multi-turn chat, streamed token by token. After each answer: how many prompt tokens came "
        "from the prefix cache (the conversation so far). Ctrl-C stops an answer and keeps the session; "
        "Ctrl-D or /exit leaves. With piped stdin: one message a line, it exits at the end of the input.",
    )
    t.add_argument("--model", default=DEFAULT_CHAT_MODEL, help=f"the chat model (default {DEFAULT_CHAT_MODEL})")
    t.add_argument("--system", default=None, help="a system prompt (default: the model's template's own)")
    t.add_argument("--max-tokens", type=_positive, default=256, help="new tokens an answer at most (default 256)")
    t.add_argument("--temperature", type=_non_negative, default=0.0, help="0 is greedy (the default)")
    e = sub.add_parser("eval", help="accuracy of the embedded model through the engine")
    e.add_argument("--num-cases", type=_positive, default=200, help="seeded copy prompts to check (default 200)")
    e.add_argument(
        "--num-blocks", type=_positive, default=None, help="KV blocks in the pool (default: sized from kv_cache_memory)"
    )
    sub.add_parser("serve", help="an OpenAI-compatible HTTP server with a live projector page (serve --help)")
    b = sub.add_parser(
        "bench",
        help="print benchmark figures",
        description="Print benchmark figures, measured side by side in one run. "
        "`python -m minipaged bench WHICH --help` lists each bench's options.",
    )
    b.add_argument("which", choices=BENCHES, help=" | ".join(BENCHES))
    b.add_argument("options", nargs=argparse.REMAINDER, help="the bench's own options")
    a = sub.add_parser(
        "animate",
        help="animate a real engine run, step by step, as a GIF or an HTML page",
        description="Animate a scripted run of the real engine, one frame per step, as a GIF or an offline HTML page.",
    )
    a.add_argument(
        "which",
        choices=("prefix", "engine"),
        help="prefix: requests sharing a preamble, a fork with copy-on-write, LRU eviction and a later hit "
        "(notebook 06); engine: requests arriving, chunked prefill, block tables growing, a preemption (notebook 05)",
    )
    a.add_argument("--out", required=True, help="the file to write: .gif, or .html (self-contained, plays offline)")
    a.add_argument("--fps", type=_rate, default=1.5, help="frames (engine steps) per second")
    a.add_argument("--max-frames", type=_positive, default=None, help="stop after this many frames")
    a.add_argument("--dpi", type=_positive, default=100, help="pixels per inch: 100 makes 1280 x 800 frames")
    c = sub.add_parser(
        "course",
        help="write a learner's copy of the notebooks and exercises: no outputs, guesses blank",
        description="Write a learner's copy of notebooks/ and exercises/ into OUT_DIR: outputs stripped, "
        "every my_guess blank, the exercises as stubs (their checks and solutions stay in the repository).",
    )
    c.add_argument("out_dir", help="a new (or empty) folder")
    c.add_argument(
        "--lang", choices=("en", "zh"), default="en", help="the language of the notebooks' prose (zh: Chinese)"
    )
    s = sub.add_parser(
        "slides",
        help="build reveal.js slides from the notebooks, one deck each, that open offline",
        description="Build one reveal.js deck per notebook (OUT_DIR/NN_name.slides.html, and index.html), "
        "with reveal.js and MathJax copied beside them: open them in a browser, no network needed.",
    )
    s.add_argument("out_dir", help="the folder to write the decks into")
    s.add_argument(
        "--lectures",
        action="store_true",
        help="the three lessons' lecture decks instead (text, figures from engine runs, speaker notes); "
        "docs/teaching/slides/ holds them built",
    )
    r = sub.add_parser("paper", help="the PagedAttention paper's results beside ours (docs/paper.md)")
    importlib.import_module("minipaged.paper.cli").add_arguments(r)
    w = sub.add_parser("download", help="fetch a known model or data file into the cache (then all runs offline)")
    w.add_argument(
        "name",
        nargs="?",
        help="a known name, e.g. smollm2-135m-instruct (--list shows them), or course: every file the notebooks read",
    )
    w.add_argument("--list", action="store_true", help="list the known names, their sizes and whether cached")
    args = p.parse_args(argv)
    what = f"bench {args.which}" if args.cmd == "bench" else args.cmd
    try:
        run(args)
    except ModuleNotFoundError as e:
        fix = missing_extra(e)
        if fix is None:
            raise
        p.exit(2, f"{p.prog} {what}: its libraries are not installed ({e.name} is missing): {fix}\n")
    except (ValueError, OSError) as e:  # bad input (a damaged model file, a missing path): say what, not where
        p.exit(1, f"{p.prog} {what}: error: {e}\n")


def _demo(args: argparse.Namespace) -> None:
    from minipaged.cli.demo import main as demo

    demo(args)


def _chat(args: argparse.Namespace) -> None:
    from minipaged.cli.chat import main as chat

    chat(args)


def _course(args: argparse.Namespace) -> None:
    from minipaged.course.learner import make_learner_copy

    try:
        written = make_learner_copy(args.out_dir, lang=args.lang)
    except (FileExistsError, ValueError) as e:  # a used folder, an incomplete translation: nothing written
        raise SystemExit(f"minipaged course: {e}") from None
    print(f"{len(written)} files written to {args.out_dir}: jupyter lab {args.out_dir}/notebooks/")


def _slides(args: argparse.Namespace) -> None:
    if args.lectures:
        from minipaged.course.lectures import build_lectures

        decks = build_lectures(args.out_dir)
        index = Path(args.out_dir) / "index.html"
        print(f"{len(decks)} lecture decks written to {args.out_dir}: open {index} in a browser (s: speaker notes)")
        return
    from minipaged.course.slides import build_slides

    decks = build_slides(args.out_dir)
    print(f"{len(decks)} decks written to {args.out_dir}: open {args.out_dir}/index.html in a browser")


def _animate(args: argparse.Namespace) -> None:
    from minipaged.viz import animate

    animate.main(args.which, args.out, fps=args.fps, max_frames=args.max_frames, dpi=args.dpi)


# What the notebooks read besides the package: the real model (notebooks 00, 05, 06, 07) and ShareGPT (00, 06, 07).
COURSE_FILES = ("smollm2-135m-instruct", "sharegpt")


def _download(args: argparse.Namespace) -> None:
    from minipaged.model import hub

    if args.name == "course" and not args.list:  # before class: everything, so that the room can go offline
        for name in COURSE_FILES:
            hub.download_command(name)
        return
    hub.download_command(args.name, args.list)


def _paper(args: argparse.Namespace) -> None:
    importlib.import_module("minipaged.paper.cli").main(args)


def _bench(args: argparse.Namespace) -> None:
    if args.which in BENCH_NEEDS and not {"-h", "--help"} & set(args.options):
        importlib.import_module(BENCH_NEEDS[args.which])
    importlib.import_module(f"minipaged.bench.{args.which}").main(args.options)


# Each subcommand's runner; each imports its libraries when it runs, so that a missing extra
# fails only the command that needs it (main names the extra).
COMMANDS = {
    "demo": _demo,
    "chat": _chat,
    "eval": evaluate,
    "course": _course,
    "slides": _slides,
    "animate": _animate,
    "download": _download,
    "paper": _paper,
    "bench": _bench,
}


def run(args: argparse.Namespace) -> None:
    """Run the parsed subcommand (``serve`` is dispatched before parsing)."""
    COMMANDS[args.cmd](args)


if __name__ == "__main__":
    main(sys.argv[1:])
