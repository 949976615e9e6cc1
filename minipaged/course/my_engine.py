"""The checks of ``my_engine``, the learner's own engine, one stage per notebook.

``python -m minipaged course OUT`` writes ``OUT/my_engine/``: one module per stage, each a stub
that says what to write, every piece marked **core** (the stage's idea) or **stretch** (further).
The closing cell of each notebook runs :func:`check` on the learner's module; ``python -m
exercises`` runs every stage. Each check compares the learner's code with the package's own
(the reference) on cases it builds, and a failure says which case, what was expected, what came
back and, where the answer matches a typical mistake, which one.

=====  ===========================  =========================================================
stage  module                       the learner writes
=====  ===========================  =========================================================
0      ``stage0_contiguous.py``     bytes per token; a contiguous cache (first fit); waste
1      ``stage1_block_pool.py``     ``BlockPool``: free queue, ``ref_cnt``, ``share``; ``touch``
2      ``stage2_block_table.py``    ``BlockTable``: ``append_tokens``, ``physical``; ``free``
3      ``stage3_attention.py``      ``slot_mapping``, ``store_kv``, paged decode attention; prefill
4      ``stage4_kernels.py``        the K/V write in Triton; the paged decode kernel (Triton track)
5      ``stage5_scheduler.py``      ``KVCacheManager`` (``allocate_slots``, ``free``) and the
                                    ``Scheduler``: admission, continuous batching, preemption;
                                    chunked prefill
6      ``stage6_prefix_cache.py``   chained block hashes, hits; LRU eviction, copy-on-write, forks
=====  ===========================  =========================================================

The names are vLLM's (``KVCacheBlock``, ``BlockPool``, ``ref_cnt``, ``block_hash``,
``slot_mapping``, ``block_tables``, ``KVCacheManager.get_computed_blocks / allocate_slots /
free``), so the learner's engine reads like the real one.

The reference solutions are not in the learner's copy: the course's tests check them, and check
that each stub, and a typical mistake in each stage, fails with a message that helps.
"""

from __future__ import annotations

import functools
import importlib.util
import random
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

PACKAGE = "my_engine"

# stage -> (module stem, what it builds)
STAGES: dict[int, tuple[str, str]] = {
    0: ("stage0_contiguous", "the contiguous cache"),
    1: ("stage1_block_pool", "the block pool: free queue, ref counts"),
    2: ("stage2_block_table", "block tables"),
    3: ("stage3_attention", "slot mapping and paged attention in torch"),
    4: ("stage4_kernels", "the Triton kernels (Triton track)"),
    5: ("stage5_scheduler", "the KV door and the scheduler"),
    6: ("stage6_prefix_cache", "the prefix cache"),
}


class CheckFailed(AssertionError):
    """A case the learner's code gets wrong: what it was, what was expected, what came back, and a hint."""

    def __init__(self, case: str, want: object, got: object, hint: str = "") -> None:
        self.case, self.want, self.got, self.hint = case, want, got, hint
        lines = [case, f"  want {_short(want)}", f"  got  {_short(got)}"]
        if hint:
            lines.append(f"  likely mistake: {hint}")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Check:
    name: str
    level: str  # "core" or "stretch"
    run: Callable[[ModuleType], None]


@dataclass(frozen=True)
class Result:
    stage: int
    name: str
    level: str
    status: str  # "pass", "todo" (a stub not written yet) or "fail"
    message: str = ""


def _short(value: object, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _outcome(call: Callable[[], Any], errors: tuple[type[BaseException], ...], name: str) -> object:
    """What ``call()`` returns, or ``name`` when it raises one of ``errors``."""
    try:
        return call()
    except errors:
        return name


def _must_raise(call: Callable[[], object], errors: tuple[type[BaseException], ...], case: str, hint: str) -> None:
    try:
        call()
    except errors:
        return
    raise CheckFailed(case, " or ".join(e.__name__ for e in errors), "no error", hint)


# ---------------------------------------------------------------- finding and loading the learner's files


def find_root(start: Path | None = None) -> Path:
    """The folder holding ``my_engine/``: ``start`` (default: the working directory) or a folder above it."""
    here = Path.cwd() if start is None else Path(start)
    for folder in [here, *here.resolve().parents]:
        if (folder / PACKAGE / "__init__.py").is_file():
            return folder
    raise FileNotFoundError(
        f"no {PACKAGE}/ in {here} or a folder above it: `python -m minipaged course OUT` writes one (OUT/{PACKAGE}/)"
    )


def load(stage: int, root: Path | None = None) -> ModuleType:
    """The learner's module of ``stage``, read afresh from its file (an edit is seen without restarting)."""
    root = find_root() if root is None else Path(root)
    stem = STAGES[stage][0]
    path = root / PACKAGE / f"{stem}.py"
    name = f"_my_engine_{stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- running the checks


def _todo(exc: BaseException, module: ModuleType) -> str | None:
    """The stub's own words, when ``exc`` is a NotImplementedError raised in the learner's file."""
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    target = str(Path(module.__file__ or "").resolve())
    for e in chain:
        frames = traceback.extract_tb(e.__traceback__)
        if isinstance(e, NotImplementedError) and frames and str(Path(frames[-1].filename).resolve()) == target:
            return f"not written yet: {e}" if str(e) else f"not written yet ({frames[-1].name})"
    return None


def run(stage: int, module: ModuleType | None = None, root: Path | None = None) -> list[Result]:
    """Every check of ``stage`` on ``module`` (default: the learner's file), in order."""
    if module is None:
        try:
            module = load(stage, root)
        except Exception as exc:  # a syntax error, a missing file: every check reports it
            where = traceback.format_exception_only(type(exc), exc)[-1].strip()
            if isinstance(exc, SyntaxError):
                where += f" (line {exc.lineno} of {Path(exc.filename or '').name})"
            return [Result(stage, c.name, c.level, "fail", f"cannot import the module: {where}") for c in CHECKS[stage]]
    results = []
    for c in CHECKS[stage]:
        try:
            c.run(module)
        except CheckFailed as exc:
            results.append(Result(stage, c.name, c.level, "fail", str(exc)))
        except Exception as exc:
            todo = _todo(exc, module)
            if todo is not None:
                results.append(Result(stage, c.name, c.level, "todo", todo))
                continue
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == module.__file__]
            where = (
                f" (line {frames[-1].lineno} of {Path(frames[-1].filename).name}: {frames[-1].line})" if frames else ""
            )
            results.append(Result(stage, c.name, c.level, "fail", f"raised {type(exc).__name__}: {exc}{where}"))
        else:
            results.append(Result(stage, c.name, c.level, "pass"))
    return results


def format_results(stage: int, results: list[Result]) -> str:
    """The report of one stage: a line per check, the first failure of each level in full."""
    stem, what = STAGES[stage]
    lines = [f"my_engine stage {stage} ({stem}.py: {what})"]
    for level in ("core", "stretch"):
        for r in (r for r in results if r.level == level):
            mark = {"pass": "pass", "todo": "TODO", "fail": "FAIL"}[r.status]
            lines.append(f"  {mark:4}  {level:7} {r.name}")
            if r.status != "pass":
                lines += [f"          {line}" for line in r.message.splitlines()]
    core = [r for r in results if r.level == "core"]
    if all(r.status == "pass" for r in core):
        stretch = [r for r in results if r.level == "stretch"]
        done = sum(r.status == "pass" for r in stretch)
        lines.append(f"  core done; stretch {done}/{len(stretch)}")
    return "\n".join(lines)


def check(stage: int, root: Path | None = None) -> list[Result]:
    """A notebook's closing cell: check the learner's ``my_engine`` stage and print what stands."""
    results = run(stage, root=root)
    print(format_results(stage, results))
    return results


def summary(results_by_stage: dict[int, list[Result]]) -> str:
    """One line per stage: core and stretch, each ``pass`` or ``todo`` / ``FAIL`` with the first check that is not."""
    lines = ["my_engine: your engine, stage by stage"]
    for stage, results in results_by_stage.items():
        cells = []
        for level in ("core", "stretch"):
            bad = next((r for r in results if r.level == level and r.status != "pass"), None)
            word = "pass" if bad is None else f"{'todo' if bad.status == 'todo' else 'FAIL'} ({bad.name})"
            cells.append(f"{level}: {word}")
        lines.append(f"  {stage}  {STAGES[stage][0] + '.py':24} {cells[0]:52} {cells[1]}".rstrip())
    return "\n".join(lines)


# ---------------------------------------------------------------- stage 0: the contiguous cache


def _stage0_bytes(m: ModuleType) -> None:
    cases = [
        ((2, 2, 32, 4), "the embedded model, fp32"),
        ((40, 40, 128, 2), "OPT-13B, fp16"),
        ((30, 3, 64, 2), "SmolLM2-135M, bf16 (GQA)"),
        ((4, 1, 16, 1), "one KV head (MQA), 1 byte"),
    ]
    for (layers, kv_heads, head_dim, nbytes), what in cases:
        want = 2 * layers * kv_heads * head_dim * nbytes
        got = m.kv_bytes_per_token(layers, kv_heads, head_dim, nbytes)
        if got != want:
            hint = ""
            if got == want // 2:
                hint = "a token stores a key AND a value: the factor 2"
            elif got == want // nbytes:
                hint = "count bytes, not numbers: multiply by dtype_bytes"
            elif got == want // layers:
                hint = "every layer keeps its own K/V: multiply by num_layers"
            raise CheckFailed(f"kv_bytes_per_token{(layers, kv_heads, head_dim, nbytes)} ({what})", want, got, hint)


def _stage0_reserve(m: ModuleType, mine: Any, ref: Any, seq: int, case: str) -> object:
    from minipaged.kv.contiguous import ArenaFullError

    want = _outcome(lambda: ref.reserve(seq, mine.max_seq_len), (ArenaFullError,), "CacheFullError")
    got = _outcome(lambda: mine.reserve(seq), (m.CacheFullError,), "CacheFullError")
    if got != want:
        hint = ""
        if want == "CacheFullError":
            hint = "when no hole holds max_seq_len slots, raise CacheFullError"
        elif got == "CacheFullError" or (isinstance(got, int) and isinstance(want, int) and got > want):
            hint = "first fit: reuse the first hole big enough, counting from slot 0 (freed buffers leave holes)"
        raise CheckFailed(case, want, got, hint)
    return want


def _stage0_cache(m: ModuleType) -> None:
    from minipaged.kv.contiguous import FirstFitArena

    for seed in range(6):
        rng = random.Random(seed)
        num_slots, max_len = rng.choice([(64, 16), (100, 24), (96, 32)])
        mine, ref = m.ContiguousCache(num_slots, max_len), FirstFitArena(num_slots)
        live: list[int] = []
        history: list[str] = []
        for step in range(40):
            if live and (rng.random() < 0.4 or len(live) * max_len + max_len > num_slots):
                seq = live.pop(rng.randrange(len(live)))
                mine.free(seq)
                ref.free(seq)
                history.append(f"free({seq})")
                continue
            history.append(f"reserve({step})")
            case = f"ContiguousCache({num_slots}, {max_len}): " + ", ".join(history[-6:])
            start = _stage0_reserve(m, mine, ref, step, case)
            if not isinstance(start, int):
                continue
            live.append(step)
            pos = rng.randrange(max_len)
            if mine.slot(step, pos) != start + pos:
                raise CheckFailed(
                    f"{case}; slot({step}, {pos})", start + pos, mine.slot(step, pos), "slot = start + pos"
                )
        if live:
            _must_raise(
                functools.partial(mine.slot, live[0], max_len),
                (IndexError,),
                f"slot({live[0]}, {max_len}) with max_seq_len {max_len}",
                "a position past the buffer must raise IndexError, not write into the next one",
            )


def _stage0_waste(m: ModuleType) -> None:
    cache = m.ContiguousCache(100, 20)
    for seq in ("a", "b", "c"):
        cache.reserve(seq)
    tokens = {"a": 5, "b": 20, "c": 0}
    want = 1 - 25 / 60
    got = cache.waste(tokens)
    if abs(got - want) > 1e-9:
        hint = (
            "the share of the RESERVED slots (3 x 20), not of all num_slots" if abs(got - (1 - 25 / 100)) < 1e-9 else ""
        )
        raise CheckFailed("3 buffers of 20 holding 5, 20 and 0 tokens: waste(...)", want, got, hint)


# ---------------------------------------------------------------- stage 1: the block pool


def _queue(pool: Any) -> list[int]:
    queue = getattr(pool, "free_block_queue", None)
    if queue is None:
        queue = pool.free_queue
    return [b.block_id for b in queue]


def _pool_ops(rng: random.Random, num_blocks: int) -> list[tuple]:
    """A random script of allocate / share / free on named holders."""
    ops: list[tuple] = []
    holders: dict[str, int] = {}
    free = num_blocks
    for i in range(30):
        r = rng.random()
        if holders and r < 0.35:
            name = rng.choice(sorted(holders))
            ops.append(("free", name))
            free += holders.pop(name)  # an upper bound: shared blocks stay taken
        elif holders and r < 0.5:
            name = rng.choice(sorted(holders))
            ops.append(("share", name, f"s{i}"))
            holders[f"s{i}"] = 0
        else:
            n = rng.randint(1, max(1, min(4, free)))
            ops.append(("allocate", f"r{i}", n))
            holders[f"r{i}"] = n
            free -= n
    return ops


def _stage1_step(m: ModuleType, pools: tuple[Any, Any], held: tuple[dict, dict], op: tuple, done: list[str]) -> None:
    """One operation of the script on the learner's pool and the package's, the learner's answer checked."""
    from minipaged.kv.block_pool import NoFreeBlocksError

    (mine, ref), (held_mine, held_ref), (kind, name) = pools, held, op[:2]
    if kind == "allocate":
        done.append(f"{name} = allocate({op[2]})")
        want = _outcome(lambda: ref.allocate(op[2]), (NoFreeBlocksError,), "NoFreeBlocksError")
        got = _outcome(lambda: mine.allocate(op[2]), (m.NoFreeBlocksError,), "NoFreeBlocksError")
        ids = [[b.block_id for b in x] if isinstance(x, list) else x for x in (want, got)]
        if ids[0] != ids[1]:
            hint = "hand out the FRONT of the free queue (popleft), the block freed longest ago"
            if want == "NoFreeBlocksError":
                hint = "asking for more blocks than are free raises NoFreeBlocksError and takes nothing"
            raise CheckFailed(f"BlockPool({len(ref.blocks)}): " + "; ".join(done[-5:]), ids[0], ids[1], hint)
        if isinstance(want, list):
            held_ref[name], held_mine[name] = want, got
    elif kind == "share":
        done.append(f"{op[2]} = share({name})")
        for pool, holding in ((ref, held_ref), (mine, held_mine)):
            for b in holding[name]:
                pool.share(b)
            holding[op[2]] = list(holding[name])
    else:
        done.append(f"free({name})")
        ref.free(held_ref.pop(name))
        mine.free(held_mine.pop(name))


def _stage1_same(mine: Any, ref: Any, case: str) -> None:
    want_cnt, got_cnt = [b.ref_cnt for b in ref.blocks], [b.ref_cnt for b in mine.blocks]
    if got_cnt != want_cnt:
        hint = "share adds 1 to ref_cnt; free takes 1 away; allocate sets it to 1"
        raise CheckFailed(case + ": ref_cnt of blocks 0..", want_cnt, got_cnt, hint)
    if _queue(mine) != _queue(ref):
        hint = "a block goes back to the free queue only when its ref_cnt reaches 0"
        if sorted(_queue(mine)) == sorted(_queue(ref)):
            hint = "free walks a table TAIL FIRST (reversed) and appends each freed block at the back"
        raise CheckFailed(case + ": free queue, front first", _queue(ref), _queue(mine), hint)


def _stage1_pool(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool

    for seed in range(8):
        rng = random.Random(seed)
        num_blocks = rng.choice([6, 10, 12])
        pools = (m.BlockPool(num_blocks), BlockPool(num_blocks))
        held: tuple[dict, dict] = ({}, {})
        done: list[str] = []
        for op in _pool_ops(rng, num_blocks):
            if op[0] != "allocate" and op[1] not in held[1]:  # its allocation was refused
                continue
            _stage1_step(m, pools, held, op, done)
            _stage1_same(*pools, f"BlockPool({num_blocks}): " + "; ".join(done[-5:]))
    pool = m.BlockPool(4)
    blocks = pool.allocate(2)
    pool.free(blocks)
    _must_raise(
        lambda: pool.free(blocks[:1]),
        (ValueError, RuntimeError),
        "allocate(2), free them, free the first again",
        "freeing a block whose ref_cnt is 0 is a bug in the caller: raise ValueError",
    )


def _stage1_touch(m: ModuleType) -> None:
    pool = m.BlockPool(6)
    a = pool.allocate(3)
    pool.free(a)  # queue: 3 4 5 2 1 0
    pool.touch(a[1])  # a hit on a free block: it leaves the middle of the queue
    want = ([3, 4, 5, 2, 0], [0, 1, 0, 0, 0, 0])
    got = (_queue(pool), [b.ref_cnt for b in pool.blocks])
    if got != want:
        hint = "touch takes a free block OUT of the free queue (wherever it is) and sets ref_cnt 1"
        raise CheckFailed(
            "BlockPool(6): a = allocate(3); free(a); touch(a[1]) -> (free queue, ref_cnt)", want, got, hint
        )
    pool.touch(a[1])
    if a[1].ref_cnt != 2:
        raise CheckFailed("touch on a block in use", 2, a[1].ref_cnt, "a block in use just gets one more reference")


# ---------------------------------------------------------------- stage 2: block tables


def _stage2_table(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool
    from minipaged.kv.block_table import BlockTable

    for seed in range(6):
        rng = random.Random(seed)
        block_size = rng.choice([1, 4, 16])
        pool_mine, pool_ref = BlockPool(40), BlockPool(40)
        for p in (pool_mine, pool_ref):  # the same shuffled free queue in both
            blocks = p.allocate(40)
            for b in random.Random(seed).sample(blocks, 40):
                p.free([b])
        mine, ref = m.BlockTable(block_size), BlockTable(block_size)
        grown = []
        for _ in range(8):
            n = rng.choice([1, 1, 1, 3, block_size, 2 * block_size + 1])
            if ref.num_tokens + n > 40 * block_size // 5:
                break
            grown.append(n)
            want, got = ref.append_tokens(n, pool_ref), mine.append_tokens(n, pool_mine)
            case = f"BlockTable({block_size}), append_tokens of {grown}"
            want_state, got_state = (want, ref.block_ids, ref.num_tokens), (got, mine.block_ids, mine.num_tokens)
            if got_state != want_state:
                hint = "take a block only when the tokens do not fit the last one: "
                hint += "cdiv(num_tokens + n, block_size) - len(block_ids) new blocks"
                raise CheckFailed(case + ": (new ids, block_ids, num_tokens)", want_state, got_state, hint)
        _stage2_positions(mine, ref, f"BlockTable({block_size}), append_tokens of {grown}")


def _stage2_positions(mine: Any, ref: Any, case: str) -> None:
    for pos in range(ref.num_tokens):
        if mine.physical(pos) != ref.physical(pos):
            hint = "logical block pos // block_size -> block_ids[...], offset pos % block_size"
            raise CheckFailed(f"{case}: physical({pos})", ref.physical(pos), mine.physical(pos), hint)
    _must_raise(
        lambda: mine.physical(ref.num_tokens),
        (IndexError,),
        f"{case}: physical({ref.num_tokens}) (past the last token)",
        "a position the table holds no token for must raise IndexError",
    )


def _stage2_free(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool
    from minipaged.kv.block_table import BlockTable

    pool_mine, pool_ref = BlockPool(8), BlockPool(8)
    mine, ref = m.BlockTable(4), BlockTable(4)
    mine.append_tokens(10, pool_mine)
    ref.append_tokens(10, pool_ref)
    mine.free(pool_mine)
    ref.free(pool_ref)
    want, got = (_queue(pool_ref), ref.block_ids, ref.num_tokens), (_queue(pool_mine), mine.block_ids, mine.num_tokens)
    if got != want:
        raise CheckFailed(
            "BlockTable(4) of 10 tokens, free(pool): (free queue, block_ids, num_tokens)",
            want,
            got,
            "give every block back to the pool (pool.free takes blocks, tail first) and empty the table",
        )


# ---------------------------------------------------------------- stage 3: slot mapping and attention in torch


def _random_tables(rng: random.Random, num_blocks: int, block_size: int, lens: list[int]) -> list[list[int]]:
    ids = rng.sample(range(num_blocks), num_blocks)
    tables, at = [], 0
    for n in lens:
        k = -(-n // block_size)
        tables.append(ids[at : at + k])
        at += k
    return tables


def _stage3_slots(m: ModuleType) -> None:
    from minipaged.kv.slot_mapping import build_slot_mapping

    for seed in range(10):
        rng = random.Random(seed)
        block_size = rng.choice([1, 4, 16])
        ends = [rng.randint(1, 40) for _ in range(rng.randint(1, 4))]
        starts = [rng.choice([0, e - 1, rng.randrange(e)]) for e in ends]
        tables = _random_tables(rng, 64, block_size, ends)
        want = build_slot_mapping(tables, starts, ends, block_size).tolist()
        got = m.slot_mapping(tables, starts, ends, block_size)
        got_list = got.tolist() if hasattr(got, "tolist") else list(got)
        if got_list != want or getattr(got, "dtype", None) is not None and str(got.dtype) != "torch.int64":
            hint = "slot = block_table[pos // block_size] * block_size + pos % block_size, positions start .. end - 1"
            if sorted(got_list) == sorted(want):
                hint = "pack the sequences in order, each one's positions in order"
            case = f"slot_mapping(block_tables={tables}, starts={starts}, ends={ends}, block_size={block_size})"
            raise CheckFailed(case + " (int64)", want, got_list, hint)


def _caches(
    seed: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def _stage3_store(m: ModuleType, store: Callable | None = None) -> None:
    import torch

    from minipaged.attention.reference import store_kvcache

    store = m.store_kv if store is None else store
    for seed, (block_size, heads, dim) in enumerate([(4, 2, 8), (16, 1, 32), (1, 3, 5)]):
        k_mine, v_mine = _caches(seed, 6, block_size, heads, dim)
        k_ref, v_ref = k_mine.clone(), v_mine.clone()
        gen = torch.Generator().manual_seed(100 + seed)
        n = 5
        key, value = torch.randn(n, heads, dim, generator=gen), torch.randn(n, heads, dim, generator=gen)
        slots = torch.tensor([3, 0, -1, 6 * block_size - 1, -1][:n], dtype=torch.int64)
        store(key, value, k_mine, v_mine, slots)
        store_kvcache(key, value, k_ref, v_ref, slots)
        case = f"store_kv of 5 tokens into slots {slots.tolist()}, block_size {block_size}, {heads} KV heads x {dim}"
        for what, got, want in (("k_cache", k_mine, k_ref), ("v_cache", v_mine, v_ref)):
            if not torch.equal(got, want):
                wrong = sorted({int(s) for s in (got != want).any(-1).any(-1).reshape(-1).nonzero().flatten()})
                hint = (
                    "slot -1 writes nothing (a padding token)"
                    if 6 * block_size - 1 in wrong and -1 in slots.tolist()
                    else ""
                )
                raise CheckFailed(
                    case + f": slots of {what} that differ",
                    [],
                    wrong,
                    hint or "view the cache as [num_slots, num_kv_heads, head_dim] and write row slot",
                )


def _attention_cases() -> list[tuple[str, int, int, int, int, list[int]]]:
    """(name, num_heads, num_kv_heads, head_dim, block_size, context_lens) for the attention checks."""
    return [
        ("MHA", 2, 2, 8, 4, [5, 9, 1]),
        ("GQA 4 on 2", 4, 2, 8, 4, [7, 13]),
        ("MQA 3 on 1", 3, 1, 5, 16, [20, 3]),
        ("GQA 8 on 2, blocks of 1", 8, 2, 4, 1, [6, 2, 4]),
    ]


def _decode_mistakes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> dict[str, torch.Tensor]:
    """What typical mistakes return, to name the one a wrong answer matches."""
    import torch

    from minipaged.attention.reference import causal_attention, gather_kv

    out: dict[str, Any] = {}
    heads, kv_heads = q.shape[1], k_cache.shape[2]

    def run(f: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
        res = torch.empty_like(q)
        for i, n in enumerate(lens.tolist()):
            res[i : i + 1] = f(i, n)
        return res

    def attend(qi: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: float) -> torch.Tensor:
        return causal_attention(qi, k, v, s)

    out["no scale (scores not multiplied by head_dim ** -0.5)"] = run(
        lambda i, n: attend(q[i : i + 1], gather_kv(k_cache, tables[i], n), gather_kv(v_cache, tables[i], n), 1.0)
    )
    if heads != kv_heads:
        modulo = torch.arange(heads) % kv_heads

        def by_modulo(i: int, n: int) -> torch.Tensor:
            k = gather_kv(k_cache, tables[i], n)[:, modulo]
            v = gather_kv(v_cache, tables[i], n)[:, modulo]
            return attend(q[i : i + 1], k, v, scale)

        out["query head h reads KV head h % num_kv_heads; it is h // (num_heads // num_kv_heads)"] = run(by_modulo)
    block_size = k_cache.shape[1]

    def whole_blocks(i: int, n: int) -> torch.Tensor:
        full = -(-n // block_size) * block_size
        return causal_attention(
            q[i : i + 1], gather_kv(k_cache, tables[i], full), gather_kv(v_cache, tables[i], full), scale
        )

    out["keys past context_len read (the last block's empty slots): stop at context_len"] = run(whole_blocks)
    out["the blocks read in pool order: read block_tables[i][j], not block j"] = run(
        lambda i, n: attend(
            q[i : i + 1],
            gather_kv(k_cache, torch.arange(tables.shape[1], dtype=torch.int32), n),
            gather_kv(v_cache, torch.arange(tables.shape[1], dtype=torch.int32), n),
            scale,
        )
    )
    return out


def _padded(tables: list[list[int]]) -> torch.Tensor:
    import torch

    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)


def _stage3_decode(m: ModuleType, attention: Callable | None = None) -> None:
    import torch

    from minipaged.attention.reference import paged_decode_attention

    attention = m.paged_decode_attention if attention is None else attention
    for seed, (name, heads, kv_heads, dim, block_size, lens) in enumerate(_attention_cases()):
        rng = random.Random(seed)
        num_blocks = 3 + sum(-(-n // block_size) for n in lens)
        k_cache, v_cache = _caches(seed, num_blocks, block_size, kv_heads, dim)
        tables = _padded(_random_tables(rng, num_blocks, block_size, lens))
        context_lens = torch.tensor(lens, dtype=torch.int32)
        q = torch.randn(len(lens), heads, dim, generator=torch.Generator().manual_seed(seed))
        scale = dim**-0.5
        want = paged_decode_attention(q, k_cache, v_cache, tables, context_lens, scale)
        got = attention(q, k_cache, v_cache, tables, context_lens, scale)
        if got.shape != want.shape or not torch.allclose(got.float(), want, atol=1e-5, rtol=1e-4):
            hint = ""
            if got.shape == want.shape:
                for mistake, value in _decode_mistakes(q, k_cache, v_cache, tables, context_lens, scale).items():
                    if torch.allclose(got.float(), value, atol=1e-5, rtol=1e-4):
                        hint = mistake
                        break
            case = (
                f"paged_decode_attention, {name}: {heads} query heads, {kv_heads} KV heads, head_dim {dim}, "
                f"block_size {block_size}, context_lens {lens}, block_tables {tables.tolist()}"
            )
            shown_got = got.flatten()[:4].tolist() if got.shape == want.shape else f"shape {tuple(got.shape)}"
            raise CheckFailed(
                case,
                [round(x, 4) for x in want.flatten()[:4].tolist()],
                shown_got if isinstance(shown_got, str) else [round(x, 4) for x in shown_got],
                hint,
            )


def _stage3_prefill(m: ModuleType) -> None:
    import torch

    from minipaged.attention.reference import paged_prefill_attention

    for seed, (name, heads, kv_heads, dim, block_size, lens) in enumerate(_attention_cases()):
        rng = random.Random(seed)
        num_blocks = 3 + sum(-(-n // block_size) for n in lens)
        k_cache, v_cache = _caches(seed, num_blocks, block_size, kv_heads, dim)
        tables = _padded(_random_tables(rng, num_blocks, block_size, lens))
        q_lens = [max(1, n - rng.randrange(n)) for n in lens]  # a chunk, or the rest after a prefix hit
        cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        context_lens = torch.tensor(lens, dtype=torch.int32)
        q = torch.randn(sum(q_lens), heads, dim, generator=torch.Generator().manual_seed(seed))
        want = paged_prefill_attention(q, k_cache, v_cache, tables, cu, context_lens, dim**-0.5)
        got = m.paged_prefill_attention(q, k_cache, v_cache, tables, cu, context_lens, dim**-0.5)
        if got.shape != want.shape or not torch.allclose(got.float(), want, atol=1e-5, rtol=1e-4):
            hint = (
                "query i of a sequence sits at position context_len - q_len + i and sees keys 0 .. that position "
                "(a chunk or the rest of a prompt after a prefix hit does not start at 0)"
            )
            case = f"paged_prefill_attention, {name}: q_lens {q_lens}, context_lens {lens}, block_size {block_size}"
            rows = [
                r
                for r in range(want.shape[0])
                if got.shape != want.shape or not torch.allclose(got[r].float(), want[r], atol=1e-5, rtol=1e-4)
            ]
            raise CheckFailed(case + ": the rows of q that differ", [], rows[:12], hint)


# ---------------------------------------------------------------- stage 4: the Triton kernels


def _stage4_store(m: ModuleType) -> None:
    _stage3_store(m, store=m.store_kv)


def _stage4_decode(m: ModuleType) -> None:
    _stage3_decode(m, attention=m.paged_decode_attention)


# ---------------------------------------------------------------- stage 5: the KV door and the scheduler

# The workload of the scheduler checks: (name, prompt length, max_tokens), arriving together.
WORKLOAD = [("R0", 13, 6), ("R1", 25, 10), ("R2", 20, 4), ("R3", 21, 12), ("R4", 9, 8), ("R5", 30, 5)]
# (block_size, num_blocks, max_num_seqs, max_num_batched_tokens) -> the steps the reference scheduler takes
# (scheduled {name: tokens} in order, preempted), as a check of the shipped solution makes sure.
SCENARIOS: dict[str, tuple[tuple[int, int, int, int], list[tuple[list[tuple[str, int]], list[str]]]]] = {}


def drive(m: ModuleType, settings: tuple[int, int, int, int], steps: int = 200) -> list[tuple[list, list]]:
    """Run the learner's ``Scheduler`` and ``KVCacheManager`` over :data:`WORKLOAD` (every sampled token is 7)."""
    from minipaged.kv.block_pool import BlockPool

    block_size, num_blocks, max_seqs, budget = settings
    kv = m.KVCacheManager(BlockPool(num_blocks), block_size)
    sched = m.Scheduler(kv, max_seqs, budget)
    for name, prompt_len, max_tokens in WORKLOAD:
        sched.add_request(m.Request(name, list(range(prompt_len)), max_tokens))
    trace: list[tuple[list, list]] = []
    for _ in range(steps):
        if not sched.waiting and not sched.running:
            break
        out = sched.schedule()
        trace.append((list(out.num_scheduled_tokens.items()), list(out.preempted)))
        sched.update_from_output(out, {name: 7 for name in out.num_scheduled_tokens})
    return trace


def _stage5_door(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool

    pool = BlockPool(6)
    kv = m.KVCacheManager(pool, 4)
    r = m.Request("A", list(range(10)), 4)
    got = kv.allocate_slots(r, 10)
    if got is None or [b.block_id for b in got] != [0, 1, 2]:
        raise CheckFailed(
            "KVCacheManager(BlockPool(6), block_size 4): allocate_slots(A with 10 prompt tokens, 10)",
            [0, 1, 2],
            got and [b.block_id for b in got],
            "cdiv(10, 4) = 3 blocks",
        )
    r.num_computed_tokens = 10
    r.output_token_ids.append(7)
    want: list[int] = []
    for _ in range(2):
        got = kv.allocate_slots(r, 1)
        if got is None or [b.block_id for b in got] != want:
            raise CheckFailed(
                f"A holds {r.num_computed_tokens} tokens in 3 blocks: allocate_slots(A, 1)",
                want,
                got and [b.block_id for b in got],
                "a new block only when the last one is full",
            )
        r.num_computed_tokens += 1
        r.output_token_ids.append(7)
    got = kv.allocate_slots(r, 1)
    if got is None or [b.block_id for b in got] != [3]:
        raise CheckFailed(
            "A holds 12 tokens in 3 full blocks: allocate_slots(A, 1)",
            [3],
            got and [b.block_id for b in got],
            "the 13th token needs a 4th block",
        )
    b = m.Request("B", list(range(9)), 4)
    if kv.allocate_slots(b, 9) is not None or pool.num_free_blocks != 2:
        raise CheckFailed(
            "2 blocks free: allocate_slots(B with 9 tokens, 9)",
            ("None", "2 blocks still free"),
            "blocks taken",
            "not enough free blocks: return None and take nothing",
        )
    kv.free(r)
    want = [4, 5, 3, 2, 1, 0]
    if _queue(pool) != want:
        raise CheckFailed(
            "free(A) after A held [0, 1, 2, 3]: the pool's free queue",
            want,
            _queue(pool),
            "give the request's blocks to pool.free in logical order (it frees them tail first)",
        )


def _schedule_hint(want: tuple, got: tuple, settings: tuple[int, int, int, int]) -> str:
    """The likely mistake behind a step that differs."""
    (w_sched, w_pre), (g_sched, g_pre) = want, got
    max_seqs, budget = settings[2], settings[3]
    rules = [
        (w_pre and g_pre and g_pre != w_pre, "preempt the NEWEST running request (the last of running) until it fits"),
        (w_pre and not g_pre, "when allocate_slots returns None, preempt the newest running request and try again"),
        (w_pre and g_pre == w_pre and len(g_sched) > len(w_sched), "a step that preempted admits nobody waiting"),
        (
            [n for n, _ in g_sched] != [n for n, _ in w_sched] and sorted(g_sched) == sorted(w_sched),
            "running requests first, oldest first; then waiting ones, front first",
        ),
        (
            sum(n for _, n in g_sched) > budget,
            "a step computes at most max_num_batched_tokens tokens: a long prompt goes in chunks",
        ),
        (len(g_sched) > max_seqs, "at most max_num_seqs requests run"),
        (
            len(g_sched) < len(w_sched),
            "admit waiting requests, front first, while the budget, max_num_seqs and free blocks allow",
        ),
    ]
    return next((hint for applies, hint in rules if applies), "")


def _compare_trace(m: ModuleType, key: str) -> None:
    settings, want = SCENARIOS[key]
    got = drive(m, settings)
    block_size, num_blocks, max_seqs, budget = settings
    where = (
        f"{len(WORKLOAD)} requests (name, prompt, max_tokens) {WORKLOAD}, block_size {block_size}, "
        f"{num_blocks} blocks, max_num_seqs {max_seqs}, max_num_batched_tokens {budget}"
    )
    for step, (w, g) in enumerate(zip(want, got)):
        if w != g:
            raise CheckFailed(f"{where}: step {step} (scheduled, preempted)", w, g, _schedule_hint(w, g, settings))
    if len(got) != len(want):
        raise CheckFailed(
            f"{where}: steps until every request finished",
            len(want),
            len(got),
            "each step must move every scheduled request on (update_from_output is given)",
        )


def _stage5_schedule(m: ModuleType) -> None:
    _compare_trace(m, "whole prompts")


def _stage5_chunked(m: ModuleType) -> None:
    _compare_trace(m, "chunked prefill")


SCENARIOS["whole prompts"] = (
    (8, 14, 4, 512),
    [
        ([("R0", 13), ("R1", 25), ("R2", 20), ("R3", 21)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 1)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 1)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 1)], []),
        ([("R0", 1), ("R1", 1), ("R3", 1), ("R4", 9)], []),
        ([("R0", 1), ("R1", 1), ("R3", 1), ("R4", 1)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 30)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 1)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1)], ["R5"]),
        ([("R1", 1), ("R3", 1), ("R4", 1)], []),
        ([("R3", 1), ("R4", 1), ("R5", 32)], []),
        ([("R3", 1), ("R4", 1), ("R5", 1)], []),
        ([("R5", 1)], []),
    ],
)
SCENARIOS["chunked prefill"] = (
    (8, 14, 4, 16),
    [
        ([("R0", 13), ("R1", 3)], []),
        ([("R0", 1), ("R1", 15)], []),
        ([("R0", 1), ("R1", 7), ("R2", 8)], []),
        ([("R0", 1), ("R1", 1), ("R2", 12), ("R3", 2)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 13)], []),
        ([("R0", 1), ("R1", 1), ("R2", 1), ("R3", 6)], []),
        ([("R1", 1), ("R2", 1), ("R3", 1), ("R4", 9)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 13)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 13)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 4)], []),
        ([("R1", 1), ("R3", 1), ("R4", 1)], ["R5"]),
        ([("R1", 1), ("R3", 1), ("R4", 1), ("R5", 13)], []),
        ([("R3", 1), ("R4", 1), ("R5", 14)], []),
        ([("R3", 1), ("R4", 1), ("R5", 4)], []),
        ([("R3", 1), ("R5", 1)], []),
        ([("R3", 1), ("R5", 1)], []),
        ([("R3", 1), ("R5", 1)], []),
    ],
)


# ---------------------------------------------------------------- stage 6: the prefix cache


def _stage6_hashes(m: ModuleType) -> None:
    from minipaged.kv.prefix_cache import chain_hashes

    for seed in range(6):
        rng = random.Random(seed)
        block_size = rng.choice([1, 4, 16])
        tokens = [rng.randrange(50) for _ in range(rng.randint(0, 70))]
        want, got = chain_hashes(tokens, block_size), m.block_hashes(tokens, block_size)
        if got != want:
            hint = ""
            if len(got) != len(want):
                hint = "only FULL blocks get a hash: len(token_ids) // block_size of them"
            elif got[:1] == want[:1]:
                hint = "each block's parent is the hash of the block before it (block 0's is ROOT_HASH)"
            case = f"block_hashes({len(tokens)} tokens, block_size {block_size})"
            raise CheckFailed(case, want[:3], got[:3], hint or "hash_block(parent hash, this block's token ids)")


def _prefix_setup(m: ModuleType) -> tuple[Any, Any, list[int], list[Any]]:
    from minipaged.kv.block_pool import BlockPool

    pool = BlockPool(8)
    cache = m.PrefixCache(pool, 4)
    a = list(range(100, 114))  # 14 tokens: 3 full blocks and 2 more
    blocks = pool.allocate(4)
    cache.cache_full_blocks(a, blocks)
    return pool, cache, a, blocks


def _stage6_hits(m: ModuleType) -> None:
    pool, cache, a, blocks = _prefix_setup(m)
    ids = [b.block_id for b in blocks]
    if [b.block_hash is not None for b in blocks] != [True, True, True, False]:
        raise CheckFailed(
            "cache_full_blocks(A's 14 tokens, its 4 blocks of 4): which blocks get a block_hash",
            [True, True, True, False],
            [b.block_hash is not None for b in blocks],
            "only full blocks are cached: the 4th holds 2 tokens",
        )
    cases = [
        ("B = A's first 9 tokens + 7 others", a[:9] + [1] * 7, ids[:2], ""),
        (
            "A's first 12 tokens exactly",
            a[:12],
            ids[:2],
            "a hit stops before the block of the prompt's last token: its logits are needed, so it is computed again",
        ),
        (
            "C: A's tokens with token 5 changed",
            a[:5] + [0] + a[6:],
            ids[:1],
            "the hits stop at the first block that is not cached: the chain continues only through hits",
        ),
        ("D: nothing in common", [9] * 20, [], ""),
    ]
    for what, tokens, want, hint in cases:
        got = [b.block_id for b in cache.get_computed_blocks(tokens)]
        if got != want:
            raise CheckFailed(
                f"A cached (blocks {ids}, 4 tokens a block); get_computed_blocks({what})",
                want,
                got,
                hint or "walk block_hashes(prompt) in order; stop at the first miss",
            )


def _stage6_lru(m: ModuleType) -> None:
    pool, cache, a, blocks = _prefix_setup(m)
    pool.free(blocks)  # A finished: its blocks go back tail first, their hashes kept
    taken = pool.allocate(5)  # 4 never-used blocks first, then A's 4th (no hash), then ...
    want_taken = [4, 5, 6, 7, 3]
    if [b.block_id for b in taken] != want_taken:
        raise CheckFailed(
            "8 blocks, A held 0-3 and finished; allocate(5)",
            want_taken,
            [b.block_id for b in taken],
            "stage 1's free queue: never-used blocks first, then A's blocks tail first",
        )
    got = [b.block_id for b in cache.get_computed_blocks(a)]
    if got != [0, 1, 2]:
        raise CheckFailed(
            "after that, get_computed_blocks(A's 14 tokens): A's cached blocks are still free, not reused",
            [0, 1, 2],
            got,
            "a freed block keeps its block_hash until the pool hands it out again",
        )
    pool.allocate(1)  # block 2: A's third block is evicted
    got = [b.block_id for b in cache.get_computed_blocks(a)]
    if got != [0, 1]:
        raise CheckFailed(
            "then allocate(1) reuses block 2 (A's 3rd block): get_computed_blocks(A's 14 tokens)",
            [0, 1],
            got,
            "evict(block) must drop a reused block from cached_block_hash_to_block (the pool calls on_evict)",
        )


def _stage6_cow(m: ModuleType) -> None:
    from minipaged.kv.block_pool import BlockPool, fork_blocks
    from minipaged.kv.prefix_cache import copy_on_write

    pools = {"mine": BlockPool(10), "ref": BlockPool(10)}
    tables: dict[str, list[list[int]]] = {}
    for key, pool in pools.items():
        parent = [b.block_id for b in pool.allocate(2)]
        fork = m.fork if key == "mine" else fork_blocks
        tables[key] = [parent, fork(pool, parent), fork(pool, parent)]
    if [[b.ref_cnt for b in p.blocks[:2]] for p in pools.values()] != [[3, 3], [3, 3]]:
        raise CheckFailed(
            "a parent of 2 blocks forked twice: ref_cnt of its blocks",
            [3, 3],
            [b.ref_cnt for b in pools["mine"].blocks[:2]],
            "a fork shares every block: ref_cnt + 1 each",
        )
    if tables["mine"][1] is tables["mine"][0]:
        raise CheckFailed(
            "fork returns the child's table",
            "a new list",
            "the parent's own list",
            "return a copy: the child's table changes on its own later (copy-on-write)",
        )
    for i in range(3):
        want = copy_on_write(pools["ref"], tables["ref"][i], 1)
        got = m.copy_on_write(pools["mine"], tables["mine"][i], 1)
        if got != want or tables["mine"] != tables["ref"]:
            hint = "a shared block (ref_cnt > 1) is copied into a new block; the last user writes in place (None)"
            raise CheckFailed(
                f"3 tables share [0, 1]; table {i} writes into its block 1: (copy, tables)",
                (want, tables["ref"]),
                (got, tables["mine"]),
                hint,
            )
    if [b.ref_cnt for b in pools["mine"].blocks] != [b.ref_cnt for b in pools["ref"].blocks]:
        raise CheckFailed(
            "after the three writes: ref_cnt of every block",
            [b.ref_cnt for b in pools["ref"].blocks],
            [b.ref_cnt for b in pools["mine"].blocks],
            "drop one reference to the shared block you copied",
        )


CHECKS: dict[int, list[Check]] = {
    0: [
        Check("kv_bytes_per_token", "core", _stage0_bytes),
        Check("ContiguousCache: reserve, free, slot", "core", _stage0_cache),
        Check("ContiguousCache.waste", "stretch", _stage0_waste),
    ],
    1: [
        Check("BlockPool: allocate, free, share", "core", _stage1_pool),
        Check("BlockPool.touch", "stretch", _stage1_touch),
    ],
    2: [
        Check("BlockTable: append_tokens, physical", "core", _stage2_table),
        Check("BlockTable.free", "stretch", _stage2_free),
    ],
    3: [
        Check("slot_mapping", "core", _stage3_slots),
        Check("store_kv", "core", _stage3_store),
        Check("paged_decode_attention", "core", _stage3_decode),
        Check("paged_prefill_attention", "stretch", _stage3_prefill),
    ],
    4: [
        Check("store_kv_kernel (Triton)", "core", _stage4_store),
        Check("paged_decode_kernel (Triton)", "stretch", _stage4_decode),
    ],
    5: [
        Check("KVCacheManager: allocate_slots, free", "core", _stage5_door),
        Check("Scheduler: admission, continuous batching, preemption", "core", _stage5_schedule),
        Check("Scheduler: chunked prefill", "stretch", _stage5_chunked),
    ],
    6: [
        Check("block_hashes", "core", _stage6_hashes),
        Check("PrefixCache: cache_full_blocks, get_computed_blocks", "core", _stage6_hits),
        Check("PrefixCache: LRU eviction", "stretch", _stage6_lru),
        Check("fork and copy_on_write", "stretch", _stage6_cow),
    ],
}
