"""A command whose libraries come with an extra names that extra when one is missing, as ``serve`` does.

The missing library is simulated: ``sys.modules[name] = None`` makes ``import name`` raise
ModuleNotFoundError, as on a base install (``pip install -e .``) without the extra.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import minipaged.__main__ as cli
from minipaged.engine.llm import LLM

CASES = [  # (argv, the library taken away, the extra the message must name)
    (["course", "{tmp}/learner"], "nbstripout", "notebooks"),
    (["course", "{tmp}/learner"], "nbformat", "notebooks"),
    (["slides", "{tmp}/decks"], "jupyter_server_mathjax", "notebooks"),
    (["slides", "{tmp}/decks"], "nbconvert", "notebooks"),
    (["bench", "engine", "--quick"], "transformers", "test"),
    (["bench", "chat", "--quick"], "transformers", "test"),
    (["bench", "serve", "--num-prompts", "1"], "httpx", "serve"),
    (["serve"], "uvicorn", "serve"),
    (["serve"], "fastapi", "serve"),
]


def went_on(*args, **kwargs):
    raise AssertionError("the command went on to build an engine without the library it needs")


@pytest.mark.parametrize("argv,module,extra", CASES, ids=[f"{' '.join(a[:2])}-{m}" for a, m, _ in CASES])
def test_missing_library_names_its_extra(argv, module, extra, monkeypatch, tmp_path, capsys):
    for name in list(sys.modules):  # a library imported earlier would not be imported again
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)
    # Should the command miss its missing library, it fails here rather than serve forever.
    monkeypatch.setattr(LLM, "__init__", went_on)
    with pytest.raises(SystemExit) as exit_:
        cli.main([a.format(tmp=tmp_path) for a in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert module in err and f'pip install -e ".[{extra}]"' in err, err
    assert "Traceback" not in err


def test_every_library_maps_to_an_extra_that_lists_it():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from pathlib import Path

    extras = tomllib.loads((Path(cli.__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    listed = {e: " ".join(deps).replace("-", "_") for e, deps in extras.items()}
    for module, extra in cli.EXTRAS.items():
        # nbformat, nbconvert and nbclient come with jupyterlab; the serve extra is in the notebooks one
        assert module in listed[extra] or extra == "notebooks" and module in ("nbformat", "nbconvert", "nbclient")


def test_a_module_of_no_extra_is_not_hidden(monkeypatch):
    monkeypatch.setattr(cli, "run", lambda args: __import__("minipaged_no_such_module"))
    with pytest.raises(ModuleNotFoundError):
        cli.main(["eval"])


def test_download_course_fetches_every_file_the_notebooks_read(monkeypatch):
    """``python -m minipaged download course``: the teacher's guide names it as the step before class."""
    from minipaged.__main__ import COURSE_FILES, main
    from minipaged.model import hub

    fetched = []
    monkeypatch.setattr(hub, "download_command", lambda name, list_only=False: fetched.append(name))
    main(["download", "course"])
    assert fetched == list(COURSE_FILES) and set(COURSE_FILES) <= set(hub.KNOWN_FILES)
    guide = (Path(__file__).resolve().parents[1] / "docs" / "teaching.md").read_text(encoding="utf-8")
    assert "python -m minipaged download course" in guide
