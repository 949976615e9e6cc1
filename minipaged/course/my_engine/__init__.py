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

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

from minipaged.course.my_engine.attention_checks import (
    _stage3_decode,
    _stage3_prefill,
    _stage3_slots,
    _stage3_store,
    _stage4_decode,
    _stage4_store,
)
from minipaged.course.my_engine.base import PACKAGE, STAGES, Check, CheckFailed, Result
from minipaged.course.my_engine.kv_checks import (
    _stage0_bytes,
    _stage0_cache,
    _stage0_waste,
    _stage1_pool,
    _stage1_touch,
    _stage2_free,
    _stage2_table,
)
from minipaged.course.my_engine.prefix_checks import _stage6_cow, _stage6_hashes, _stage6_hits, _stage6_lru
from minipaged.course.my_engine.scheduler_checks import (
    SCENARIOS,
    WORKLOAD,
    _stage5_chunked,
    _stage5_door,
    _stage5_schedule,
    drive,
)

__all__ = [
    "PACKAGE",
    "SCENARIOS",
    "STAGES",
    "WORKLOAD",
    "Check",
    "CheckFailed",
    "Result",
    "check",
    "drive",
    "find_root",
    "format_results",
    "load",
    "run",
    "summary",
]

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
