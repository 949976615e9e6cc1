"""The lecture decks' figures, each drawn from a real run by the package's own drawing functions.

Every entry of :data:`FIGURES` is a function with no arguments that runs something small — the
embedded copy model through ``LLM()``, the stage 0 replay of a seeded trace, a block pool — and
returns the matplotlib ``Figure`` that :mod:`minipaged.viz` (or :mod:`minipaged.paper.plots`)
draws of it. A slide names its figure (``![caption](fig:NAME)``) and
:func:`minipaged.course.lectures.build_lectures` saves it as ``figures/NAME.png``. Nothing is
downloaded: the paper's figures read the committed results in ``docs/paper/``.

Runs are seeded and use one CPU thread; all of them together take well under a minute.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure

if TYPE_CHECKING:
    from minipaged.viz.animate import Movie

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "docs" / "paper"
MAX_SEQ_LEN, NUM_SLOTS, BLOCK_SIZE = 512, 4096, 16  # notebook 00's trace and arena


@cache
def _trace() -> list:
    from minipaged.sim import synthetic_trace

    return synthetic_trace(200, seed=0, mean_prompt=128, mean_output=64, max_len=MAX_SEQ_LEN, arrival_rate=0.5)


def _arena_at(step: int, reserve: str) -> tuple:
    from minipaged.sim import ContiguousReplay, replay_steps
    from minipaged.sim.states import ContiguousState

    for state in replay_steps(_trace(), ContiguousReplay(NUM_SLOTS, MAX_SEQ_LEN, reserve)):
        if state.step == step and isinstance(state, ContiguousState):
            return state.arena, state.tokens
    raise ValueError(f"the replay never reaches step {step}")


def memory_map() -> Figure:
    """Stage 0: the arena at step 300 when every request reserves ``max_seq_len``."""
    from minipaged.viz.memory import draw_memory_map

    arena, tokens = _arena_at(300, "max")
    return draw_memory_map(arena, used=tokens, title="step 300: every request reserves 512 slots")


def fragmentation() -> Figure:
    """Stage 0 against paged memory on the same trace and the same 4096 slots."""
    from minipaged.sim import simulate_contiguous_vs_paged
    from minipaged.viz.memory import draw_fragmentation

    exact = simulate_contiguous_vs_paged(_trace(), NUM_SLOTS, BLOCK_SIZE, MAX_SEQ_LEN, reserve="exact")
    series = {"time": exact["time"], "contiguous, exact": exact["contiguous"], "paged": exact["paged"]}
    return draw_fragmentation(series, num_slots=NUM_SLOTS, title="same trace, same memory: contiguous vs paged")


def block_tables() -> Figure:
    """Logical blocks -> block table -> physical blocks, from an engine step (prefix caching shares block 0)."""
    from minipaged.engine.llm import LLM
    from minipaged.engine.sampling_params import SamplingParams
    from minipaged.tiny.task import prompt_for
    from minipaged.viz.pool import draw_block_tables
    from minipaged.viz.snapshot import step_snapshot

    llm = LLM(block_size=BLOCK_SIZE, num_kvcache_blocks=12, enable_prefix_caching=True)
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    system = "Copy the text: "  # 15 characters + <copy>: one full block of 16 tokens
    llm.add_request(prompt_for("copy me", system), sp)
    llm.add_request(prompt_for("attention", system), sp)
    snap = step_snapshot(llm)
    names = dict(zip(sorted(snap.block_tables), "AB"))
    tables = {names[s]: t for s, t in snap.block_tables.items()}
    counts = {names[s]: n for s, n in snap.num_tokens.items() if s in names}
    return draw_block_tables(tables, BLOCK_SIZE, llm.num_blocks, num_tokens=counts, ref_cnt=snap.ref_cnt,
                             title="two requests after their prefill: one shared block, ref_cnt 2")  # fmt: skip


def slot_mapping() -> Figure:
    """The ``slot_mapping`` of an engine's first step: three prompts, blocks of 4."""
    from minipaged.engine.llm import LLM
    from minipaged.engine.sampling_params import SamplingParams
    from minipaged.kv.slot_mapping import build_slot_mapping
    from minipaged.viz.slots import draw_slot_mapping
    from minipaged.viz.snapshot import step_snapshot

    llm = LLM(block_size=4, num_kvcache_blocks=12, max_num_seqs=3)
    for text in ("ab", "x", "kv"):
        llm.add_request(text, SamplingParams(temperature=0, max_tokens=2))
    snap = step_snapshot(llm)
    seqs = sorted(snap.block_tables)
    tables = [snap.block_tables[s] for s in seqs]
    lens = [snap.num_tokens[s] for s in seqs]
    slots = build_slot_mapping(tables, [0] * len(seqs), lens, 4).tolist()
    token_seq = [i for i, n in enumerate(lens) for _ in range(n)]
    token_pos = [p for n in lens for p in range(n)]
    return draw_slot_mapping(slots, token_seq, 4, llm.num_blocks, token_pos=token_pos, seq_names=["X", "Y", "Z"],
                             title="one prefill step: every prompt token gets a slot")  # fmt: skip


def launch_grid() -> Figure:
    """Stage 4: the kernel's launch grid for three sequences, two KV heads."""
    from minipaged.viz.kernel import draw_launch_grid

    return draw_launch_grid(3, 2, 3, q_lens=[5, 1, 9], block_q=4, group=2,
                            title="grid (3, 2, 3): (sequence, KV head, query tile of 4 tokens)")  # fmt: skip


def program_reads() -> Figure:
    """One decode program walking A's table ``[7, 3]`` (25 keys) in tiles of 16."""
    from minipaged.viz.kernel import draw_program_reads

    return draw_program_reads([7, 3], 25, 16, 16, num_blocks=12, title="A's decode program: table [7, 3], 25 keys")


def online_softmax() -> Figure:
    """The running max and sum of the online softmax over seeded scores."""
    import torch

    from minipaged.viz.kernel import draw_online_softmax

    return draw_online_softmax(torch.randn(32, generator=torch.Generator().manual_seed(0)) * 2, block_n=8)


@cache
def _movie(which: str) -> Movie:
    import torch

    from minipaged.viz import animate

    torch.set_num_threads(1)
    return animate.run_scenario(which)


def _frame_where(which: str, test: Callable) -> Figure:
    from minipaged.viz import animate

    movie = _movie(which)
    k = next(i for i, f in enumerate(movie.frames) if test(f))
    return animate.draw_frame(movie, k)


def engine_step() -> Figure:
    """The ``engine`` scenario's first step with chunked prefill running beside decodes."""
    return _frame_where("engine", lambda f: len(f.snapshot.scheduled) >= 3)


def preemption() -> Figure:
    """The ``engine`` scenario's first preemption."""
    return _frame_where("engine", lambda f: f.snapshot.preempted)


def timeline() -> Figure:
    """The whole ``engine`` scenario, one row per request."""
    from minipaged.viz.scheduler import draw_timeline

    movie = _movie("engine")
    return draw_timeline([f.snapshot for f in movie.frames], movie.names, title="5 requests, 12 blocks of 8")


def kv_usage() -> Figure:
    """KV slots allocated and holding tokens per step: paged against contiguous, same budget."""
    from minipaged.engine.llm import LLM
    from minipaged.engine.sampling_params import SamplingParams
    from minipaged.tiny.task import prompt_for
    from minipaged.viz.scheduler import draw_kv_usage

    texts = ("paged", "kv cache blocks", "hi", "continuous batching", "slots", "free queue", "a", "block table")
    prompts = [prompt_for(t, "") for t in texts]
    usage, running = [], []
    for layout in ("paged", "contiguous"):
        llm = LLM(block_size=8, num_kvcache_blocks=14, max_num_seqs=4, max_model_len=40, kv_layout=layout)
        for p in prompts:
            llm.add_request(p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        stats, counts = [], []
        while llm.has_unfinished_requests():
            llm.step()
            stats.append(llm.kv_stats())
            counts.append(stats[-1]["num_running"])
        usage.append(stats)
        running.append(counts)
    return draw_kv_usage(usage[0], usage[1], capacity=14 * 8, running=(running[0], running[1]))


SYSTEM = "You are a careful copy machine. Read the text after the marker and write it back exactly, "


def shared_prefix() -> Figure:
    """Four requests with one 48-token system prompt, admitted in one step."""
    from minipaged.engine.llm import LLM
    from minipaged.engine.sampling_params import SamplingParams
    from minipaged.tiny.task import prompt_for
    from minipaged.viz.prefix import draw_shared_pool
    from minipaged.viz.snapshot import step_snapshot

    llm = LLM(enable_prefix_caching=True, block_size=16, num_kvcache_blocks=64, max_model_len=256)
    for text in ("paged attention", "kv cache", "block table", "copy on write"):
        llm.add_request(prompt_for(text, SYSTEM[:48]), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    snap = step_snapshot(llm)
    labels = {s: f"request {k}" for k, s in enumerate(sorted(snap.block_tables))}
    return draw_shared_pool(snap, labels, block_size=16, title="4 requests, one 48-token system prompt")


LESSON_PREAMBLE = (
    "You are the class copy machine. Copy the text after the marker exactly, letter by letter, then stop. "
    "Today: paged attention, KV blocks of sixteen tokens."
)  # docs/teaching.md's lesson.txt: 153 characters, 9 full blocks of 16 shared by every student


def classroom() -> Figure:
    """Eight students' requests behind the lesson's preamble, as the live classroom's projector shows them."""
    from minipaged.engine.llm import LLM
    from minipaged.engine.sampling_params import SamplingParams
    from minipaged.tiny.task import prompt_for
    from minipaged.viz.prefix import draw_shared_pool
    from minipaged.viz.snapshot import step_snapshot

    llm = LLM(enable_prefix_caching=True, block_size=16, num_kvcache_blocks=96, max_model_len=256)
    students = ("ana", "row three", "hello", "kv", "paging", "bo", "zoe", "copy me")
    for text in students:
        llm.add_request(prompt_for(text, LESSON_PREAMBLE), SamplingParams(temperature=0, max_tokens=4))
    snap = step_snapshot(llm)
    labels = dict(zip(sorted(snap.block_tables), students))
    return draw_shared_pool(snap, labels, block_size=16, title="8 students, one 153-character preamble")


def copy_on_write() -> Figure:
    """The ``prefix`` scenario's first copy-on-write (a request sampling twice)."""
    return _frame_where("prefix", lambda f: f.events.cow)


def eviction() -> Figure:
    """The ``prefix`` scenario's first eviction of a cached block."""
    return _frame_where("prefix", lambda f: f.events.evicted)


def _paper(name: str) -> dict:
    from minipaged.paper.report import load

    result = load(PAPER, name)
    if result is None:
        raise FileNotFoundError(f"{PAPER}/{name}.json: run python -m minipaged paper {name}")
    return result


def paper_memory() -> Figure:
    """Figure 2 of the paper: share of KV memory holding tokens, ours beside theirs."""
    from minipaged.paper import plots

    return plots.draw_memory_shares(_paper("fig2"))


def paper_throughput() -> Figure:
    """Figure 13: serving throughput, ours beside the paper's."""
    from minipaged.paper import plots

    return plots.draw_beside_paper(_paper("fig13"), unit="")


def paper_sharing() -> Figure:
    """Figure 15: memory saved by sharing, parallel sampling and beam search."""
    from minipaged.paper import plots

    return plots.draw_beside_paper(_paper("fig15"), unit="%")


FIGURES: dict[str, Callable[[], Figure]] = {
    f.__name__: f
    for f in (memory_map, fragmentation, block_tables, slot_mapping, launch_grid, program_reads, online_softmax)
    + (engine_step, preemption, timeline, kv_usage, shared_prefix, copy_on_write, eviction, classroom)
    + (paper_memory, paper_throughput, paper_sharing)
}
