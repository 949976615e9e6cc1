"""Walk a GGUF file's header, metadata and tensor infos with every length checked before it is trusted.

What a GGUF file holds, in order (every number little-endian):

1. **The header**, 24 bytes: the magic ``GGUF``, a uint32 version (3 today), a uint64 *tensor
   count* and a uint64 *key/value count*.
2. **The key/value pairs** (the metadata): each a string key, a uint32 value type and the value.
   A *string* is a uint64 length and that many UTF-8 bytes; an *array* is a uint32 element type,
   a uint64 element count and the elements (numbers of 1 to 8 bytes, or strings). llama.cpp
   reads no arrays of arrays, and neither does minipaged.
3. **The tensor infos**: each a string name, a uint32 number of dimensions (at most 4, ggml's
   ``GGML_MAX_DIMS``), that many uint64 dimensions (fastest first), a uint32 tensor type (F32,
   Q4_1 ...) and a uint64 offset into the data section.
4. **Padding** up to the alignment (``general.alignment``, a power of two, 32 when absent), then
   **the data section**: each tensor's bytes at its offset, itself a multiple of the alignment;
   its size follows from its type and shape (``Q4_1``: 32 weights in 20 bytes).

``gguf.GGUFReader`` trusts every count it reads. Cut the file and it indexes past the end (an
``IndexError`` from numpy); let an array claim 2^55 elements and it loops 2^55 times, building a
numpy view per element (gigabytes before it would ever finish). :func:`check_layout` walks the
same bytes first, and every read checks the bytes that remain before it reads:

* an array of numbers is checked as ``count * size <= remaining``, not read;
* an array of strings is first checked as ``count * 8 <= remaining`` (each string needs at least
  its 8-byte length), then walked one string at a time, each length checked before its bytes;
* each tensor's data range (offset aligned, size from type and shape) must lie inside the file.

So nothing the header claims is allocated, the walk ends within one pass over the metadata
(about 0.1 s for the real model's 98,052 tokens and merges), and a damaged file becomes one
sentence that names the file, the place and what is wrong.
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path
from typing import NoReturn

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ELEMENTS = 2**63 - 1  # ggml counts a tensor's elements in an int64
# The bytes of one value of each fixed-size type; STRING and ARRAY have a length of their own.
FIXED_SIZES = {
    GGUFValueType.UINT8: 1,
    GGUFValueType.INT8: 1,
    GGUFValueType.UINT16: 2,
    GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4,
    GGUFValueType.INT32: 4,
    GGUFValueType.FLOAT32: 4,
    GGUFValueType.BOOL: 1,
    GGUFValueType.UINT64: 8,
    GGUFValueType.INT64: 8,
    GGUFValueType.FLOAT64: 8,
}
STRING_MIN_BYTES = 8  # an empty string is its uint64 length alone
KV_MIN_BYTES = STRING_MIN_BYTES + 4 + 1  # an empty key, a value type, a one-byte value
TENSOR_INFO_MIN_BYTES = STRING_MIN_BYTES + 4 + 4 + 8  # an empty name, no dimensions, a type, an offset
VALUE_TYPE_IDS = frozenset(t.value for t in GGUFValueType)
TENSOR_TYPE_IDS = frozenset(t.value for t in GGMLQuantizationType)


class _Walk:
    """A position in the mapped file. Each read checks the bytes that remain first; an error names
    the file and the byte where the walk stood."""

    def __init__(self, path: Path, data: mmap.mmap, pos: int) -> None:
        self.path, self.data, self.pos = path, data, pos

    def damaged(self, what: str) -> NoReturn:
        raise ValueError(f"{str(self.path)!r} is truncated or corrupt: {what}; fetch it again")

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def need(self, n: int, what: str) -> None:
        """Check that ``n`` bytes remain (without reading them) for ``what``."""
        if n > self.remaining:
            self.damaged(f"{what} needs {n} bytes at byte {self.pos}, but only {self.remaining} remain")

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def number(self, fmt: str, what: str) -> int:
        """One little-endian unsigned integer: ``"<I"`` (uint32) or ``"<Q"`` (uint64)."""
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return int(value)

    def string(self, what: str) -> str:
        """A uint64 length, then that many bytes of UTF-8 (the gguf package decodes them strictly)."""
        n = self.number("<Q", f"the length of {what}")
        if n > self.remaining:
            self.damaged(f"{what} claims {n} bytes at byte {self.pos}, but only {self.remaining} remain")
        try:
            text = self.data[self.pos : self.pos + n].decode("utf-8")
        except UnicodeDecodeError as e:
            self.damaged(f"{what} at byte {self.pos} is not UTF-8 ({e.reason} at its byte {e.start})")
        self.pos += n
        return text

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.number("<I", f"the value type of {what}")
        if raw not in VALUE_TYPE_IDS:
            self.damaged(f"{what}: value type {raw} does not exist (GGUF's run from 0 to {max(VALUE_TYPE_IDS)})")
        return GGUFValueType(raw)


def check_layout(path: Path) -> None:
    """Raise a ``ValueError`` naming ``path`` and its fault unless every count, length and tensor
    range in the file lies within it. The 24-byte header must have been checked already (magic,
    version: ``gguf_reader.check_header``)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        walk = _Walk(path, data, pos=8)  # after the magic and the version
        tensor_count = walk.number("<Q", "the tensor count")
        kv_count = walk.number("<Q", "the key/value count")
        if kv_count * KV_MIN_BYTES > walk.remaining:
            walk.damaged(
                f"the header claims {kv_count} metadata keys (at least {KV_MIN_BYTES} bytes each), "
                f"but only {walk.remaining} bytes follow it"
            )
        alignment = _metadata(walk, kv_count)
        tensors = _tensor_infos(walk, tensor_count)
        data_start = walk.pos + -walk.pos % alignment  # the tensor infos' end, padded to the alignment
        for name, offset, n_bytes in tensors:
            _check_tensor_range(walk, name, offset, n_bytes, data_start, alignment)


def _metadata(walk: _Walk, count: int) -> int:
    """Walk the key/value pairs; return the alignment (``general.alignment`` or the default)."""
    seen: set[str] = set()
    alignment = DEFAULT_ALIGNMENT
    for i in range(count):
        key = walk.string(f"the name of metadata key {i}")
        where = f"metadata key {i} ({key!r})"
        if key in seen:
            walk.damaged(f"{where} appears twice")
        seen.add(key)
        kind = walk.value_type(where)
        if key == "general.alignment":
            alignment = _alignment(walk, kind, where)
        elif kind == GGUFValueType.ARRAY:
            _array(walk, where)
        else:
            _value(walk, kind, where)
    return alignment


def _value(walk: _Walk, kind: GGUFValueType, where: str) -> None:
    """Step over one value of a type that is not an array."""
    if kind == GGUFValueType.STRING:
        walk.string(f"the string of {where}")
    else:
        walk.skip(FIXED_SIZES[kind], f"the {kind.name} value of {where}")


def _array(walk: _Walk, where: str) -> None:
    """An element type, a count, the elements: checked against the bytes that remain before any is read."""
    kind = walk.value_type(f"the elements of {where}")
    count = walk.number("<Q", f"the array length of {where}")
    if kind == GGUFValueType.ARRAY:
        walk.damaged(f"{where} is an array of arrays, which GGUF readers (llama.cpp's, minipaged's) do not read")
    if kind == GGUFValueType.STRING:
        if count * STRING_MIN_BYTES > walk.remaining:
            walk.damaged(
                f"{where} claims an array of {count} strings (at least {STRING_MIN_BYTES} bytes each), "
                f"but only {walk.remaining} bytes remain"
            )
        for j in range(count):
            walk.string(f"string {j} of {where}")
        return
    size = count * FIXED_SIZES[kind]
    if size > walk.remaining:
        walk.damaged(
            f"{where} claims an array of {count} {kind.name} values ({size} bytes), "
            f"but only {walk.remaining} bytes remain"
        )
    walk.pos += size


def _alignment(walk: _Walk, kind: GGUFValueType, where: str) -> int:
    """``general.alignment``: a uint32 power of two (the gguf package refuses any other type)."""
    if kind != GGUFValueType.UINT32:
        walk.damaged(f"{where} has type {kind.name}; the alignment is a UINT32")
    alignment = walk.number("<I", f"the value of {where}")
    if alignment == 0 or alignment & (alignment - 1):
        walk.damaged(f"{where} is {alignment}, not a power of two")
    return alignment


def _tensor_infos(walk: _Walk, count: int) -> list[tuple[str, int, int]]:
    """Each tensor's name, offset into the data section and size in bytes."""
    if count * TENSOR_INFO_MIN_BYTES > walk.remaining:
        walk.damaged(
            f"the header claims {count} tensors (at least {TENSOR_INFO_MIN_BYTES} bytes of tensor info each), "
            f"but only {walk.remaining} bytes follow the metadata"
        )
    tensors: list[tuple[str, int, int]] = []
    names: set[str] = set()
    for i in range(count):
        name = walk.string(f"the name of tensor {i}")
        where = f"tensor {i} ({name!r})"
        if name in names:
            walk.damaged(f"{where} appears twice")
        names.add(name)
        tensors.append((name, *_tensor_info(walk, where)))
    return tensors


def _tensor_info(walk: _Walk, where: str) -> tuple[int, int]:
    """The rest of one tensor info (after its name): its offset and its size in bytes."""
    n_dims = walk.number("<I", f"the number of dimensions of {where}")
    if n_dims > MAX_DIMS:
        walk.damaged(f"{where} claims {n_dims} dimensions; GGUF tensors have at most {MAX_DIMS}")
    dims = [walk.number("<Q", f"dimension {d} of {where}") for d in range(n_dims)]
    if any(n > MAX_ELEMENTS for n in dims) or math.prod(dims) > MAX_ELEMENTS:
        walk.damaged(f"{where} claims the shape {dims}, more elements than ggml can count (2^63 - 1)")
    type_id = walk.number("<I", f"the tensor type of {where}")
    if type_id not in TENSOR_TYPE_IDS:
        raise ValueError(
            f"{str(walk.path)!r} has a tensor of an unknown type: {where} has type id {type_id}, which the gguf "
            "package does not know (a newer format, or a damaged file)"
        )
    kind = GGMLQuantizationType(type_id)
    block, block_bytes = GGML_QUANT_SIZES[kind]
    row = dims[0] if dims else 1  # a tensor of no dimensions is one value
    if row % block:
        walk.damaged(f"{where} of type {kind.name} has rows of {row} values, not a multiple of its block {block}")
    offset = walk.number("<Q", f"the data offset of {where}")
    return offset, math.prod(dims) // block * block_bytes


def _check_tensor_range(walk: _Walk, name: str, offset: int, n_bytes: int, data_start: int, alignment: int) -> None:
    """A tensor's bytes start at an aligned offset of the data section and end inside the file."""
    if offset % alignment:
        walk.damaged(f"tensor {name!r} starts at offset {offset} of the data section, not a multiple of {alignment}")
    end = data_start + offset + n_bytes
    if end > len(walk.data):
        raise ValueError(
            f"{str(walk.path)!r} is truncated: tensor {name} ends at byte {end}, the file has {len(walk.data)}; "
            "fetch it again"
        )
