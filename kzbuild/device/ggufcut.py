"""Where a GGUF file may be cut so that what two models share travels as the same pieces.

A GGUF file is a header (magic, version, counts), key-value metadata, tensor infos (name,
shape, type, offset), padding, then the tensor data, each tensor at its offset from the data
start. Two quant variants of one model differ in a few tensors; every other tensor's bytes are
the same in both, only at another position in the file. Cutting at every metadata entry and at
every tensor's data start makes each unchanged tensor (and each unchanged big metadata entry,
such as a vocabulary) the same piece in both files, however the changed ones moved it.

:func:`boundaries` reads only the header (the file is mapped, not read) and raises
:class:`GgufLayoutError` for anything that is not a well-formed GGUF v2/v3 header whose tensor
offsets lie inside the file; the caller then cuts at fixed sizes instead. :func:`spans` turns
boundaries into pieces: a span of at least ``small`` bytes is a piece of its own (cut every
``largest`` bytes from its start), runs of smaller spans are merged up to ``small`` bytes.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from kzbuild.model.gguflayout import GgufHeader, GgufTensor

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # v1 (2023, 32-bit counts) is long gone from llama.cpp
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
MAX_DIMS = 8  # ggml has 4; more is a damaged file
STRING, ARRAY, UINT32 = 8, 9, 4
# fixed sizes of the scalar value types, by GGUF type id
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class GgufLayoutError(ValueError):
    """The file's header is not a GGUF header this reader can cut by."""


class _Header:
    def __init__(self, data: mmap.mmap | bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int) -> int:
        if size < 0 or self.pos + size > len(self.data):
            raise GgufLayoutError(f"the header runs past the end of the file at byte {self.pos}")
        start, self.pos = self.pos, self.pos + size
        return start

    def unpack(self, fmt: str) -> int:
        value: int = struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt)))[0]
        return value

    def string(self) -> bytes:
        size = self.unpack("<Q")
        start = self.take(size)
        return bytes(self.data[start : start + size])

    def skip_value(self, kind: int) -> None:
        if kind in SCALAR_SIZES:
            self.take(SCALAR_SIZES[kind])
        elif kind == STRING:
            self.take(self.unpack("<Q"))
        elif kind == ARRAY:
            element, count = self.unpack("<I"), self.unpack("<Q")
            if element in SCALAR_SIZES:
                self.take(SCALAR_SIZES[element] * count)
            elif element == STRING:
                for _ in range(count):
                    self.take(self.unpack("<Q"))
            else:
                raise GgufLayoutError(f"array of unknown type {element} at byte {self.pos}")
        else:
            raise GgufLayoutError(f"value of unknown type {kind} at byte {self.pos}")


def boundaries(path: Path) -> list[int]:
    """The offsets in ``path`` where a metadata entry, the tensor infos, the tensor data or one
    tensor's data starts (sorted, each inside the file, 0 excluded)."""
    with open(path, "rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # an empty file cannot be mapped
            raise GgufLayoutError("the file is empty") from exc
        with data:
            return parse(data)


def parse(data: mmap.mmap | bytes) -> list[int]:
    """:func:`boundaries` of a file's bytes."""
    header = read_header(data)
    cuts = [*header.entries, header.infos_start, header.data_start]
    cuts += [header.data_start + tensor.offset for tensor in header.tensors]
    return sorted({cut for cut in cuts if 0 < cut < len(data)})


def read_header(data: mmap.mmap | bytes) -> GgufHeader:
    """The header of a GGUF file's bytes: its metadata entries, alignment and tensors
    (GgufLayoutError unless it is a well-formed v2/v3 header whose tensors lie in the file)."""
    header = _Header(data)
    if bytes(data[:4]) != MAGIC:
        raise GgufLayoutError("no GGUF magic")
    header.take(4)
    version = header.unpack("<I")
    if version not in VERSIONS:
        raise GgufLayoutError(f"GGUF version {version} (this reader knows 2 and 3)")
    count, entries = header.unpack("<Q"), header.unpack("<Q")
    starts, keys = [], []
    alignment = DEFAULT_ALIGNMENT
    for _ in range(entries):
        starts.append(header.pos)
        key = header.string()
        keys.append(key)
        kind = header.unpack("<I")
        if key == ALIGNMENT_KEY.encode() and kind == UINT32:
            alignment = header.unpack("<I")
            if alignment == 0 or alignment & (alignment - 1):
                raise GgufLayoutError(f"alignment {alignment} is not a power of two")
        else:
            header.skip_value(kind)
    infos_start = header.pos
    tensors = []
    for _ in range(count):
        name = header.string()
        dims = header.unpack("<I")
        if dims > MAX_DIMS:
            raise GgufLayoutError(f"a tensor with {dims} dimensions at byte {header.pos}")
        shape = tuple(header.unpack("<Q") for _ in range(dims))
        kind = header.unpack("<I")
        tensors.append(GgufTensor(name, shape, kind, header.unpack("<Q")))
    start = -header.pos % alignment + header.pos
    if start > len(data):
        raise GgufLayoutError("the tensor data starts past the end of the file")
    for tensor in tensors:
        if tensor.offset % alignment or start + tensor.offset > len(data):
            raise GgufLayoutError(f"a tensor offset {tensor.offset} outside the data or unaligned")
    return GgufHeader(
        version, tuple(starts), tuple(keys), infos_start, alignment, tuple(tensors), start
    )


def spans(cuts: list[int], size: int, *, small: int, largest: int) -> list[tuple[int, int]]:
    """(offset, length) pieces that tile ``size`` bytes cut at ``cuts`` (sorted, inside the file):
    a span of ``small`` bytes or more is its own piece, cut every ``largest`` bytes from its
    start; consecutive smaller spans are merged until they reach ``small`` bytes."""
    pieces: list[tuple[int, int]] = []
    edges = [0, *cuts, size]
    run_start: int | None = None
    for start, end in zip(edges, edges[1:], strict=False):
        if end - start < small:
            run_start = start if run_start is None else run_start
            if end - run_start >= small:
                pieces.append((run_start, end - run_start))
                run_start = None
            continue
        if run_start is not None:
            pieces.append((run_start, start - run_start))
            run_start = None
        pieces += [(at, min(largest, end - at)) for at in range(start, end, largest)]
    if run_start is not None:
        pieces.append((run_start, size - run_start))
    return pieces
