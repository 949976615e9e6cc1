"""Command line: ``python -m minipaged demo | eval | serve | bench | animate | paper | course | slides``."""

from __future__ import annotations

import argparse
import importlib
import random
import sys

from minipaged.utils import cdiv

BENCHES = ("memory", "kernels", "engine", "prefix", "serve", "chat")


def demo(args: argparse.Namespace) -> None:
    """Serve a few copy prompts with the embedded model through the paged engine; print KV figures."""
    from minipaged import LLM, SamplingParams
    from minipaged.tiny import task

    rng = random.Random(args.seed)
    # One shared "system prompt" of 208 characters (13 full blocks of 16): half the requests use it.
    preamble = "You are a careful copy machine. Repeat the text between the markers exactly. " * 3
    preamble = preamble[:208]
    texts = ["hello paged attention", "blocks like os pages", "kv cache 2026", "minipaged"][: args.num_prompts]
    texts += [task.random_text(rng) for _ in range(args.num_prompts - len(texts))]
    prompts = [task.prompt_for(t, preamble if i % 2 == 0 else "") for i, t in enumerate(texts)]
    llm = LLM(block_size=16, num_kvcache_blocks=args.num_blocks, max_num_seqs=8, enable_prefix_caching=True)
    print(
        "The embedded model (2 layers, 2M parameters, shipped in the package) has learnt one task:\n"
        "copy the text between <copy> and <end>, whatever comes before it. [ok ] means it copied exactly.\n"
    )
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    ok = 0
    for text, prompt, out in zip(texts, prompts, outputs):
        got = out.outputs[0].text
        right = got == task.expected_completion(text)
        ok += right
        shared = prompt.startswith(preamble)
        shown = f"[the shared {len(preamble)}-character preamble] + " if shared else ""
        shown += repr(prompt[len(preamble) :] if shared else prompt)
        print(
            f"[{'ok ' if right else 'BAD'}] {len(out.prompt_token_ids):4d} prompt tokens, "
            f"{out.num_cached_tokens:4d} from the prefix cache"
        )
        print(f"      prompt:     {shown}")
        print(f"      completion: {got!r}")
    print(f"\n{ok}/{len(texts)} completions exact")
    s = llm.kv_stats()
    print(
        f"KV pool: {s['num_blocks']} blocks x {s['block_size']} tokens, {s['num_free_blocks']} free after the run; "
        f"{s['num_preemptions']} preemptions; prefix cache hit {s['prefix_hit_tokens']} tokens, "
        f"computed {s['prefill_tokens_computed']} prefill tokens"
    )
    lens = [len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outputs]
    block = s["block_size"]
    paged = sum(cdiv(n, block) * block for n in lens)
    contiguous = len(lens) * llm.max_model_len
    print(
        f"KV slots for these {len(lens)} sequences: {sum(lens)} tokens; paged allocates {paged} "
        f"({100 * (1 - sum(lens) / paged):.1f}% waste), contiguous would reserve {contiguous} "
        f"({100 * (1 - sum(lens) / contiguous):.1f}% waste at max_model_len={llm.max_model_len})"
    )


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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # the server parses its own flags: one per engine keyword
        return importlib.import_module("minipaged.serve.cli").main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m minipaged", description="minipaged: paged KV memory, step by step")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run the embedded model through the paged engine")
    d.add_argument("--num-prompts", type=_positive, default=8, help="how many copy prompts to serve (default 8)")
    d.add_argument("--num-blocks", type=_positive, default=64, help="KV blocks of 16 tokens in the pool (default 64)")
    d.add_argument("--seed", type=int, default=0, help="seed of the random texts after the first four (default 0)")
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
    s = sub.add_parser(
        "slides",
        help="build reveal.js slides from the notebooks, one deck each, that open offline",
        description="Build one reveal.js deck per notebook (OUT_DIR/NN_name.slides.html, and index.html), "
        "with reveal.js and MathJax copied beside them: open them in a browser, no network needed.",
    )
    s.add_argument("out_dir", help="the folder to write the decks into")
    r = sub.add_parser("paper", help="the PagedAttention paper's results beside ours (docs/paper.md)")
    importlib.import_module("minipaged.paper.cli").add_arguments(r)
    args = p.parse_args(argv)
    if args.cmd == "demo":
        demo(args)
    elif args.cmd == "eval":
        evaluate(args)
    elif args.cmd == "course":
        from minipaged.course.learner import make_learner_copy

        written = make_learner_copy(args.out_dir)
        print(f"{len(written)} files written to {args.out_dir}: jupyter lab {args.out_dir}/notebooks/")
    elif args.cmd == "slides":
        from minipaged.course.slides import build_slides

        decks = build_slides(args.out_dir)
        print(f"{len(decks)} decks written to {args.out_dir}: open {args.out_dir}/index.html in a browser")
    elif args.cmd == "animate":
        from minipaged.viz import animate

        animate.main(args.which, args.out, fps=args.fps, max_frames=args.max_frames, dpi=args.dpi)
    elif args.cmd == "paper":
        importlib.import_module("minipaged.paper.cli").main(args)
    else:
        importlib.import_module(f"minipaged.bench.{args.which}").main(args.options)


if __name__ == "__main__":
    main(sys.argv[1:])
