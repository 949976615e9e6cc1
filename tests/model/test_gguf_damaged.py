"""Damaged GGUF files: cut short, bytes flipped, counts and lengths that claim more than the file holds.

Every one either opens (and its metadata and tensors read) or gets a ``ValueError`` that names the
file; never a numpy ``IndexError`` from inside the gguf package, a loop over a claimed 2^55
elements, or an allocation of what a header claims. The damage is done to a tiny GGUF written
here (a few hundred bytes), and to the real model file when it is in the cache.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.model import hub
from minipaged.model.gguf_reader import SUPPORTED_TENSOR_TYPES, metadata, open_gguf

ALIGNMENT = 64  # not the default 32, so that general.alignment is read


def write_tiny_gguf(path: Path) -> Path:
    """A GGUF with keys of most value types (two string arrays among them) and an F32 and a Q8_0 tensor."""
    w = gguf.GGUFWriter(str(path), "tiny")
    w.add_custom_alignment(ALIGNMENT)
    w.add_uint32("tiny.count", 7)
    w.add_uint32("tiny.width", 8)
    w.add_float32("tiny.eps", 1e-5)
    w.add_bool("tiny.flag", True)
    w.add_string("tiny.name", "a tiny test file")
    w.add_array("tiny.words", ["alpha", "beta", "", "δέλτα"])
    w.add_array("tiny.ids", [3, 1, 4, 1, 5])
    w.add_array("tiny.merges", ["a b", "ab c"])
    rng = np.random.default_rng(0)
    w.add_tensor("aa.weight", rng.standard_normal((3, 8)).astype(np.float32))
    q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("bb.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf").read_bytes()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> gguf.GGUFReader:
    """The gguf package's reading of the intact tiny file: where each field and tensor lies."""
    return gguf.GGUFReader(write_tiny_gguf(tmp_path_factory.mktemp("layout") / "tiny.gguf"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file name the damaged copies are written to (hypothesis reruns a test in the same folder)."""
    return tmp_path_factory.mktemp("damaged") / "damaged.gguf"


def open_or_refuse(path: Path) -> str:
    """``"opened"`` after reading every key and tensor, or the ValueError's message (which must name the file)."""
    try:
        reader = open_gguf(path)
        metadata(reader)
        for t in reader.tensors:  # as the loader would: an empty tensor's shape is refused before dequantizing
            if t.tensor_type.name in SUPPORTED_TENSOR_TYPES and t.n_elements:
                gguf.quants.dequantize(t.data, t.tensor_type)
    except ValueError as e:
        assert path.name in str(e), f"the error does not name the file: {e}"
        assert "the gguf reader says" not in str(e), f"the layout checks missed what the gguf package tripped on: {e}"
        return str(e)
    return "opened"


def part_offset(field: gguf.ReaderField, part: int) -> int:
    """Where part ``part`` of a field (key length, key, type, value ...) starts in the file."""
    return field.offset + sum(int(p.nbytes) for p in field.parts[:part])


def data_end(reader: gguf.GGUFReader) -> int:
    return max(t.data_offset + t.n_bytes for t in reader.tensors)


def test_the_intact_file_opens(tiny, layout, scratch):
    scratch.write_bytes(tiny)
    assert open_or_refuse(scratch) == "opened"
    assert metadata(open_gguf(scratch))["tiny.words"] == ["alpha", "beta", "", "δέλτα"]
    assert layout.data_offset % ALIGNMENT == 0 and len(tiny) >= data_end(layout)


def test_a_cut_at_every_offset_is_refused_clearly(tiny, layout, scratch):
    """Header, metadata, tensor infos, padding and data: each cut short by one byte at a time."""
    needed = data_end(layout)
    for cut in range(len(tiny)):
        scratch.write_bytes(tiny[:cut])
        outcome = open_or_refuse(scratch)
        assert (outcome == "opened") == (cut >= needed), (cut, outcome)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_flipped_bytes_in_the_header_open_or_are_refused_clearly(tiny, layout, scratch, data):
    flips = data.draw(st.lists(st.tuples(st.integers(0, layout.data_offset - 1), st.integers(1, 255)), max_size=6))
    damaged = bytearray(tiny)
    for pos, mask in flips:
        damaged[pos] ^= mask
    scratch.write_bytes(damaged)
    open_or_refuse(scratch)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_huge_numbers_anywhere_in_the_header_are_refused_clearly(tiny, layout, scratch, data):
    """A uint64 or uint32 written over any header byte: counts, lengths, types, dimensions, offsets."""
    width = data.draw(st.sampled_from((4, 8)))
    pos = data.draw(st.integers(0, layout.data_offset - width))
    value = data.draw(
        st.one_of(st.sampled_from((2**32 - 1, 2**40, 2**55, 2**63, 2**64 - 1)), st.integers(0, 2**64 - 1))
    )
    cut = data.draw(st.integers(pos + width, len(tiny)))
    damaged = bytearray(tiny)
    damaged[pos : pos + width] = value.to_bytes(8, "little")[:width]
    scratch.write_bytes(bytes(damaged[:cut]))
    open_or_refuse(scratch)


def _put(pos: Callable[[gguf.GGUFReader], int], fmt: str, value: int) -> Callable[[gguf.GGUFReader, bytearray], None]:
    """A damage: ``value`` packed as ``fmt`` at the offset ``pos`` finds in the intact file's layout."""

    def damage(reader: gguf.GGUFReader, raw: bytearray) -> None:
        at = pos(reader)
        raw[at : at + struct.calcsize(fmt)] = struct.pack(fmt, value)

    return damage


def _kv(key: str, part: int) -> Callable[[gguf.GGUFReader], int]:
    return lambda r: part_offset(r.fields[key], part)


def _tensor(index: int, part: int) -> Callable[[gguf.GGUFReader], int]:
    return lambda r: part_offset(r.tensors[index].field, part)


def _write(pos: Callable[[gguf.GGUFReader], int], text: str) -> Callable[[gguf.GGUFReader, bytearray], None]:
    """A damage: ``text`` written over the bytes at the offset ``pos`` finds (a name made another's)."""

    def damage(reader: gguf.GGUFReader, raw: bytearray) -> None:
        at = pos(reader)
        raw[at : at + len(text)] = text.encode()

    return damage


# (what is damaged, how, what the error says). Parts of a key: 0 its length, 1 its name, 2 its type, then
# its value (a string: 3 length, 4 bytes; an array: 3 element type, 4 count). Parts of a tensor info:
# 0 name length, 1 name, 2 number of dimensions, 3 dimensions, 4 type, 5 offset.
CRAFTED = {
    "tensor count 2^40": (_put(lambda r: 8, "<Q", 2**40), "claims 1099511627776 tensors"),
    "key count 2^60": (_put(lambda r: 16, "<Q", 2**60), "claims 1152921504606846976 metadata keys"),
    "string array of 2^55": (_put(_kv("tiny.words", 4), "<Q", 2**55), "array of 36028797018963968 strings"),
    "number array of 2^55": (_put(_kv("tiny.ids", 4), "<Q", 2**55), "array of 36028797018963968 INT32 values"),
    "string of 2^63 bytes": (_put(_kv("tiny.name", 3), "<Q", 2**63), "claims 9223372036854775808 bytes"),
    "key name of 2^63 bytes": (_put(_kv("tiny.flag", 0), "<Q", 2**63), "claims 9223372036854775808 bytes"),
    "value type 99": (_put(_kv("tiny.count", 2), "<I", 99), r"'tiny.count'\): value type 99 does not exist"),
    "array element type 99": (_put(_kv("tiny.ids", 3), "<I", 99), "value type 99 does not exist"),
    "array of arrays": (_put(_kv("tiny.ids", 3), "<I", 9), "array of arrays"),
    "alignment 48": (_put(_kv("general.alignment", 3), "<I", 48), "is 48, not a power of two"),
    "a key twice": (_write(_kv("tiny.width", 1), "tiny.count"), r"'tiny.count'\) appears twice"),
    "a tensor twice": (_write(_tensor(1, 1), "aa.weight"), r"tensor 1 \('aa.weight'\) appears twice"),
    "n_dims 2^32 - 1": (_put(_tensor(0, 2), "<I", 2**32 - 1), "claims 4294967295 dimensions"),
    "a dimension of 2^63": (_put(_tensor(0, 3), "<Q", 2**63), "more elements than ggml can count"),
    "a Q8_0 row of 33": (_put(_tensor(1, 3), "<Q", 33), "rows of 33 values, not a multiple of its block 32"),
    "tensor type 99": (_put(_tensor(0, 4), "<I", 99), "unknown type: tensor 0 .* type id 99"),
    "tensor data past the end": (_put(_tensor(1, 5), "<Q", 2**62), "is truncated: tensor bb.weight ends at byte"),
    "tensor data misaligned": (_put(_tensor(1, 5), "<Q", ALIGNMENT + 4), "not a multiple of 64"),
    "key name not UTF-8": (_put(_kv("tiny.eps", 1), "<B", 0xFF), "the name of metadata key .* is not UTF-8"),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_crafted_headers_are_refused_by_name(tiny, layout, scratch, case):
    damage, match = CRAFTED[case]
    raw = bytearray(tiny)
    damage(layout, raw)
    scratch.write_bytes(raw)
    with pytest.raises(ValueError, match=match) as refused:
        open_gguf(scratch)
    assert scratch.name in str(refused.value)


# The crafted files read in a child process that may not allocate 1 GiB more than it holds after its
# imports, nor spend 120 s of CPU: the 2^55 elements a header claims are neither read nor allocated.
LIMITED_CHILD = """
import json, resource, sys
from pathlib import Path
from minipaged.model.gguf_reader import open_gguf
vm_bytes = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes + 2**30, vm_bytes + 2**30))
resource.setrlimit(resource.RLIMIT_CPU, (120, 120))
outcomes = {}
for path in sys.argv[1:]:
    try:
        open_gguf(Path(path))
        outcomes[path] = "opened"
    except ValueError as e:
        outcomes[path] = "ValueError: " + str(e)
print(json.dumps(outcomes))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads its memory size from Linux's /proc")
def test_huge_claims_allocate_nothing_in_a_memory_limited_process(tiny, layout, tmp_path):
    paths = []
    for i, (damage, _) in enumerate(CRAFTED.values()):
        raw = bytearray(tiny)
        damage(layout, raw)
        paths.append(tmp_path / f"crafted{i}.gguf")
        paths[-1].write_bytes(raw)
    child = subprocess.run([sys.executable, "-c", LIMITED_CHILD, *map(str, paths)], capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-2000:]
    outcomes = json.loads(child.stdout)
    for path in paths:
        assert outcomes[str(path)].startswith("ValueError: ") and path.name in outcomes[str(path)], outcomes[str(path)]


@pytest.fixture(scope="module")
def real_gguf() -> Path:
    path = hub.cached_path(hub.DEFAULT_CHAT_MODEL)
    if not path.exists():
        pytest.skip(
            f"the real model file is not cached at {path} (python -m minipaged download {hub.DEFAULT_CHAT_MODEL})"
        )
    return path


@pytest.mark.parametrize(
    ("keep", "match"),
    [
        (lambda size: 24, r"claims 33 metadata keys .* but only 0 bytes follow"),
        (lambda size: 1 << 20, r"'tokenizer.ggml.merges'\) claims an array of 48900 strings"),
        (lambda size: size // 2, r"is truncated: tensor blk\.\d+\.\w+\.weight ends at byte"),
    ],
    ids=["first 24 bytes", "first MiB", "half"],
)
def test_the_real_file_cut_short_is_refused_by_name(real_gguf, tmp_path, keep, match):
    cut = tmp_path / "SmolLM2-cut.gguf"
    with open(real_gguf, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(keep(real_gguf.stat().st_size)))
    with pytest.raises(ValueError, match=match) as refused:
        open_gguf(cut)
    assert cut.name in str(refused.value)
