"""``my_engine``, the learner's own engine: the reference solutions pass every check, the stubs as
shipped fail each one with what to write, and a typical mistake in each stage fails with a
message that names it.

The reference solutions are ``tests/course/my_engine_solutions/my_engine/`` (never copied into a
learner's copy); the stubs are ``my_engine/`` at the repository root; the checks are
:mod:`minipaged.course.my_engine`.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

from minipaged.course import my_engine

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = Path(__file__).resolve().parent / "my_engine_solutions"
STAGES = sorted(my_engine.STAGES)


def solution(stage: int) -> ModuleType:
    """A fresh copy of a stage's reference solution (a test may break one piece of it)."""
    return my_engine.load(stage, SOLUTIONS)


@pytest.mark.parametrize("stage", STAGES)
def test_reference_solutions_pass_every_check(stage):
    results = my_engine.run(stage, root=SOLUTIONS)
    assert [r.status for r in results] == ["pass"] * len(results), my_engine.format_results(stage, results)
    assert {r.level for r in results} == {"core", "stretch"}


@pytest.mark.parametrize("stage", STAGES)
def test_stubs_as_shipped_say_what_to_write(stage):
    results = my_engine.run(stage, root=ROOT)
    for r in results:
        assert r.status == "todo" and r.message.startswith("not written yet: "), r
    report = my_engine.format_results(stage, results)
    assert "TODO  core" in report and "core done" not in report


def stub_functions(path: Path) -> list[tuple[str, str]]:
    """(name, docstring) of every function of a stub file whose body raises NotImplementedError."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(s, ast.Raise) and "NotImplementedError" in ast.unparse(s) for s in node.body
        ):
            found.append((node.name, ast.get_docstring(node) or ""))
    return found


@pytest.mark.parametrize("stage", STAGES)
def test_every_stub_says_core_or_stretch_and_what_to_write(stage):
    path = ROOT / "my_engine" / f"{my_engine.STAGES[stage][0]}.py"
    stubs = stub_functions(path)
    assert stubs, path
    for name, doc in stubs:
        assert re.match(r"\*\*(core|stretch)\*\* — \S", doc), (
            f"{path.name}: {name}'s docstring starts with **core** or **stretch**"
        )
    levels = set(re.findall(r"\*\*(core|stretch)\b", "\n".join(doc for _, doc in stubs)))
    assert levels == {"core", "stretch"}, (path.name, levels)  # a stretch piece may live in a core one's docstring
    # the stub raises with words for the learner, naming the piece
    text = path.read_text(encoding="utf-8")
    for message in re.findall(r'raise NotImplementedError\(\s*"([^"]+)"', text):
        assert ": " in message and len(message) > 30, message


def test_stubs_and_solutions_have_the_same_names():
    """The reference solutions fill the stubs in: the same classes, functions and methods, the same signatures."""
    for stage in STAGES:
        stem = my_engine.STAGES[stage][0]
        shapes = []
        for root in (ROOT, SOLUTIONS):
            tree = ast.parse((root / "my_engine" / f"{stem}.py").read_text(encoding="utf-8"))
            shapes.append(
                sorted(
                    (node.name, [a.arg for a in node.args.args])
                    for node in ast.walk(tree)
                    if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
                )
            )
        assert shapes[0] == shapes[1], stem


# A typical mistake in each stage: (stage, what to break, the words the message must hold).
def _bytes_without_k_and_v(m, tmp):
    m.kv_bytes_per_token = lambda layers, heads, dim, nbytes: layers * heads * dim * nbytes


def _bump_allocator(m, tmp):
    def reserve(self, seq_id):
        start = max((s + self.max_seq_len for s in self.starts.values()), default=0)
        if start + self.max_seq_len > self.num_slots:
            raise m.CacheFullError("full")
        self.starts[seq_id] = start
        return start

    m.ContiguousCache.reserve = reserve


def _free_head_first(m, tmp):
    def free(self, blocks):
        for block in blocks:  # not reversed
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    m.BlockPool.free = free


def _block_per_call(m, tmp):
    def append_tokens(self, n, pool):
        new = [b.block_id for b in pool.allocate(1)]  # a block every call, full or not
        self.block_ids += new
        self.num_tokens += n
        return new

    m.BlockTable.append_tokens = append_tokens


def _unscaled_attention(m, tmp):
    original = m.paged_decode_attention
    m.paged_decode_attention = lambda q, k, v, t, c, scale=None: original(q, k, v, t, c, 1.0)


def _prefill_from_zero(m, tmp):
    def attend(q, k, v, scale, first_pos):
        return real(q, k, v, scale, 0)  # every chunk as if it started the sequence

    real = m._attend
    m._attend = attend


def _rewrite(m, old, new, folder):
    """The module again, from a copy of its file with ``old`` replaced by ``new`` (a mistake written into it).

    A file, not only compiled code: Triton reads a kernel's source from its file."""
    source = Path(m.__file__).read_text(encoding="utf-8")
    assert source.count(old) == 1, old
    (folder / "my_engine").mkdir()
    (folder / "my_engine" / "__init__.py").write_text("")
    (folder / "my_engine" / Path(m.__file__).name).write_text(source.replace(old, new), encoding="utf-8")
    stage = next(s for s, (stem, _) in my_engine.STAGES.items() if stem == Path(m.__file__).stem)
    m.__dict__.update({k: v for k, v in vars(my_engine.load(stage, folder)).items() if not k.startswith("__")})


def _preempt_oldest(m, tmp):
    """``running.pop(0)``: the oldest request is preempted, the one closest to finishing."""
    _rewrite(m, "victim = self.running.pop()", "victim = self.running.pop(0)", tmp)


def _free_hits_not_counted(m, tmp):
    """A free cached hit is touched out of the free queue but not counted among the blocks needed."""
    _rewrite(m, "max(needed, 0) + revived > self.pool.num_free_blocks", "needed > self.pool.num_free_blocks", tmp)


def _kernel_unscaled(m, tmp):
    """The Triton decode kernel's scores not multiplied by the scale."""
    _rewrite(m, "tl.sum(k * qv[None, :], axis=1) * scale", "tl.sum(k * qv[None, :], axis=1)", tmp)


def _no_cap_on_hits(m, tmp):
    def get_computed_blocks(self, token_ids):
        hits = []
        for h in m.block_hashes(token_ids, self.block_size):  # the last token's block too
            if h not in self.cached_block_hash_to_block:
                break
            hits.append(self.cached_block_hash_to_block[h])
        return hits

    m.PrefixCache.get_computed_blocks = get_computed_blocks


MISTAKES = [
    (0, _bytes_without_k_and_v, "kv_bytes_per_token", "the factor 2"),
    (0, _bump_allocator, "ContiguousCache: reserve, free, slot", "first fit"),
    (1, _free_head_first, "BlockPool: allocate, free, share", "TAIL FIRST"),
    (2, _block_per_call, "BlockTable: append_tokens, physical", "take a block only when"),
    (3, _unscaled_attention, "paged_decode_attention", "no scale"),
    (3, _prefill_from_zero, "paged_prefill_attention", "context_len - q_len + i"),
    (4, _kernel_unscaled, "paged_decode_kernel (Triton)", "no scale"),
    (5, _free_hits_not_counted, "KVCacheManager: allocate_slots, free", "leaves the free queue"),
    (5, _preempt_oldest, "Scheduler: admission, continuous batching, preemption", "NEWEST"),
    (6, _no_cap_on_hits, "PrefixCache: cache_full_blocks, get_computed_blocks", "last token"),
]


@pytest.mark.parametrize("stage,mistake,check,words", MISTAKES, ids=[m[1].__name__.strip("_") for m in MISTAKES])
def test_a_typical_mistake_fails_with_a_message_that_names_it(stage, mistake, check, words, tmp_path):
    module = solution(stage)
    mistake(module, tmp_path)
    results = {r.name: r for r in my_engine.run(stage, module=module)}
    r = results[check]
    assert r.status == "fail", r
    assert "want " in r.message and "got " in r.message and "likely mistake: " in r.message, r.message
    assert words in r.message, r.message
    # the other checks of the stage are not blamed for it
    others = [x for x in results.values() if x.name != check and x.status != "pass"]
    assert all(x.level == "stretch" or x.name != check for x in others)


def test_an_error_in_the_learners_code_names_its_line(tmp_path):
    engine = tmp_path / "my_engine"
    engine.mkdir()
    (engine / "__init__.py").write_text("")
    src = (SOLUTIONS / "my_engine" / "stage2_block_table.py").read_text(encoding="utf-8")
    broken = src.replace("return self.block_ids[pos // self.block_size], pos % self.block_size", "return 1 / 0")
    assert broken != src
    (engine / "stage2_block_table.py").write_text(broken, encoding="utf-8")
    (r, *_) = my_engine.run(2, root=tmp_path)
    assert r.status == "fail" and "ZeroDivisionError" in r.message and "stage2_block_table.py" in r.message
    (engine / "stage2_block_table.py").write_text("def broken(:\n", encoding="utf-8")
    assert all("cannot import the module: SyntaxError" in r.message for r in my_engine.run(2, root=tmp_path))


def test_no_engine_folder_says_how_to_get_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m minipaged course OUT"):
        my_engine.find_root(tmp_path)


def test_summary_gives_each_stage_core_and_stretch():
    results = {0: my_engine.run(0, root=SOLUTIONS), 2: my_engine.run(2, root=ROOT)}
    lines = my_engine.summary(results).splitlines()
    assert "core: pass" in lines[1] and "stretch: pass" in lines[1]
    assert "core: todo (BlockTable: append_tokens, physical)" in lines[2], lines[2]
    assert "stretch: todo (BlockTable.free)" in lines[2], lines[2]


def test_the_command_reports_one_stage_and_its_status():
    done = subprocess.run(
        [sys.executable, "-m", "exercises", "my_engine", "6", "--root", str(SOLUTIONS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "core done; stretch 2/2" in done.stdout, done.stdout + done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "exercises", "my_engine", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "TODO  core    BlockPool" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("stage", STAGES)
def test_each_notebook_closes_with_its_stage_check(stage):
    name = my_engine.STAGES[stage][0]
    notebook = next((ROOT / "notebooks").glob(f"{stage:02d}_*.ipynb"))
    cells = nbformat.read(notebook, as_version=4).cells
    code = [i for i, c in enumerate(cells) if c.cell_type == "code" and f"check({stage})" in c.source]
    assert len(code) == 1, notebook.name
    heading = cells[code[0] - 1].source
    assert heading.startswith(f"## Your engine, stage {stage}") and f"my_engine/{name}.py" in heading
    assert "**core**" in heading and "**stretch**" in heading
