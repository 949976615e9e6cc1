"""A learner's copy of the course: ``python -m minipaged course OUT_DIR``.

The committed notebooks keep their outputs, so that they read well on the web; a learner who
opens them sees the saved pictures, and every folded *Why*, before predicting. The copy written
here has:

- ``notebooks/``: every notebook with its outputs, execution counts and saved widget state
  stripped (by nbstripout, the tool most Jupyter projects use for this), and every guess cell
  reset to ``my_guess = None``, its comment kept;
- ``my_engine/``: the learner's own engine, one stub module per stage (the contiguous cache, the
  block pool, block tables, slot mapping and attention, the Triton kernels, the scheduler, the
  prefix cache), each piece marked core or stretch. Each notebook's last cell checks its stage
  (:mod:`minipaged.course.my_engine`); the reference solutions stay in the repository's
  ``tests/course/my_engine_solutions/``;
- ``exercises/``: the exercise files as they are in the repository (stubs whose bodies raise
  ``NotImplementedError``) and the checker. The checks and the reference solutions stay in the
  repository's ``tests/exercises/``: ``python -m exercises stageN`` run in the copy finds the
  checks there, through the installed package.

Nothing is overwritten: the output folder must not exist yet, or be empty.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from minipaged.course.translation import translate

if TYPE_CHECKING:
    from nbformat import NotebookNode

REPO = Path(__file__).resolve().parents[2]
GUESS = "my_guess"
README = """# Your copy of the minipaged course

Made by `python -m minipaged course` from {repo}.

- `notebooks/`: open them with `jupyter lab notebooks/` (as root: `jupyter lab --allow-root notebooks/`).
  Run the cells from the top. Where a cell says `my_guess = None`, write your guess before running the
  cell after it: it prints "you predicted X; it is Y", and the folded *Why* below says why.
- `my_engine/`: your own engine, built notebook by notebook: one module per stage, each a stub that
  says what to write (**core** first, then **stretch**). The last cell of each notebook checks your
  module for that stage; from this folder, `python -m exercises` reports every stage and
  `python -m exercises my_engine 3` one of them.
- `exercises/`: smaller exercises of each notebook in `exercises/stageN_*.py`; check them from
  this folder with `python -m exercises stage0` (`stage1`, ...).

Links in the notebooks to the package's code and docs point into the repository: {repo}.
"""
README_ZH = """# 你的 minipaged 课程副本

由 `python -m minipaged course --lang zh` 从 {repo} 生成。

- `notebooks/`：用 `jupyter lab notebooks/` 打开（以 root 身份运行时：`jupyter lab --allow-root notebooks/`）。
  从上往下运行各单元。遇到 `my_guess = None` 的单元，先写下你的猜测，再运行它后面的单元：
  它会打印 "you predicted X; it is Y"，下面折叠的 *Why* 说明原因。文字是中文，代码和它打印的内容是英文。
- `my_engine/`：你自己的引擎，一个 notebook 一个模块地搭起来：每个阶段一个桩模块，写明要写什么（先写
  **core**，再写 **stretch**）。每个 notebook 的最后一个单元格检查你这一阶段的模块；在本文件夹中，
  `python -m exercises` 报告所有阶段，`python -m exercises my_engine 3` 只查其中一个。
- `exercises/`：每个 notebook 的小练习，写在 `exercises/stageN_*.py` 里，然后在本文件夹中用
  `python -m exercises stage0`（`stage1`、……）检查。练习说明见 `exercises/README.zh.md`。

notebook 里指向包的代码和文档的链接都指向仓库：{repo}。
"""


def is_guess_cell(cell: NotebookNode) -> bool:
    """A code cell that only assigns ``my_guess``."""
    if cell.cell_type != "code":
        return False
    try:
        body = ast.parse(cell.source).body
    except SyntaxError:
        return False
    return (
        len(body) == 1
        and isinstance(body[0], ast.Assign)
        and [getattr(t, "id", None) for t in body[0].targets] == [GUESS]
    )


def blank_guess(source: str) -> str:
    """``my_guess = <anything>  # comment`` -> ``my_guess = None  # comment`` (the comment says what to guess)."""
    assign = ast.parse(source).body[0]
    end_line, end_col = assign.end_lineno, assign.end_col_offset
    assert end_line is not None and end_col is not None  # ast.parse sets them on every statement
    tail = source.splitlines()[end_line - 1][end_col:]
    return f"{GUESS} = None{tail}"


def learner_notebook(path: Path, lang: str = "en") -> NotebookNode:
    """The notebook at ``path`` as a learner should get it: no outputs, blank guesses, prose in ``lang``."""
    import nbformat
    from nbstripout import strip_output

    nb = translate(nbformat.read(path, as_version=4), path, lang)
    # nbstripout's own defaults, as its command line applies them: saved widget state, signatures
    # and per-cell execution timings go too.
    extra = [
        "metadata.signature",
        "metadata.widgets",
        "cell.metadata.collapsed",
        "cell.metadata.ExecuteTime",
        "cell.metadata.execution",
        "cell.metadata.heading_collapsed",
        "cell.metadata.hidden",
        "cell.metadata.scrolled",
    ]
    nb = strip_output(nb, keep_output=False, keep_count=False, keep_id=True, extra_keys=extra)
    for cell in nb.cells:
        if is_guess_cell(cell):
            cell.source = blank_guess(cell.source)
    return nb


def make_learner_copy(out_dir: Path, repo: Path = REPO, lang: str = "en") -> list[Path]:
    """Write ``out_dir/notebooks``, ``out_dir/my_engine`` and ``out_dir/exercises`` for a learner.

    Returns the files written.

    ``lang="zh"``: the notebooks' markdown cells in Chinese (see :mod:`minipaged.course.translation`).
    """
    import nbformat

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty: name a new folder for the learner's copy")
    # Every notebook translated before anything is written: an incomplete translation leaves no copy.
    notebooks = {path.name: learner_notebook(path, lang) for path in sorted((repo / "notebooks").glob("[0-9]*.ipynb"))}
    written = []
    (out_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    for name, nb in notebooks.items():
        target = out_dir / "notebooks" / name
        nbformat.write(nb, target)
        written.append(target)
    shutil.copytree(
        repo / "exercises", out_dir / "exercises", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "solutions")
    )
    if (repo / "my_engine").is_dir():  # the learner's engine: the stubs, never the reference solutions
        shutil.copytree(
            repo / "my_engine", out_dir / "my_engine", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
        written += sorted(p for p in (out_dir / "my_engine").rglob("*") if p.is_file())
    written += sorted(p for p in (out_dir / "exercises").rglob("*") if p.is_file())
    readme = out_dir / "README.md"
    readme.write_text((README_ZH if lang == "zh" else README).format(repo=repo), encoding="utf-8")
    return [*written, readme]
