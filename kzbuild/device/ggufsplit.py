"""A GGUF model cut into GGUF splits, llama.cpp's own multi-file form, so that two quant variants
of one model hold their shared tensors in byte-identical files.

llama.cpp loads ``NAME-00001-of-0000N.gguf`` and then ``NAME-0000i-of-0000N.gguf`` for each
other split (``llama_split_path``), maps each file and finds every tensor by its name in
whichever split lists it. The first split carries the metadata and ``split.count`` (u16),
``split.tensors.count`` (i32); every split carries ``split.no`` (u16, its index), which the
loader checks. Nothing else ties a split to its neighbours, so a split that holds the same
tensors at the same index is the same bytes in every model that has them.

:func:`plan` cuts deterministically: the first split holds every metadata entry of the model
(plus the three split keys) and no tensor; then, in the order of their data, every tensor of
``elements`` values or more is a split of its own, and each run of smaller ones (norms, biases)
shares one. The count of values, not of bytes, decides, so a tensor stored in another type is
cut the same way and every split after it keeps its index. A split's tensor data is one range of
the model's bytes, copied as it is (the padding between its tensors included), so the tensors'
offsets keep their alignment (``general.alignment``, 32 by default, written into every split
when it is not 32). Two variants that differ in one tensor's type differ in its split and in the
first; every other split is the same file, as long as both hold the same tensors in the same
order.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from kzbuild.device.ggufcut import (
    ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT,
    MAGIC,
    UINT32,
    GgufLayoutError,
    read_header,
    spans,
)
from kzbuild.model.gguflayout import GgufHeader, GgufSplit, GgufTensor

SPLIT_NO = b"split.no"
SPLIT_COUNT = b"split.count"
SPLIT_TENSORS = b"split.tensors.count"
UINT16, INT32 = 2, 5
ELEMENTS = 1 << 18  # a tensor of this many values or more is a split of its own (1 MiB in f32)
MAX_SPLITS = 65535  # split.count is a u16 (the names count them in five digits)
READ = 8 << 20


def split_name(prefix: str, index: int, count: int) -> str:
    """llama.cpp's name of split ``index`` (from 0) of ``count``: PREFIX-0000i-of-0000N.gguf."""
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


def plan(model: Path, *, elements: int = ELEMENTS) -> tuple[GgufSplit, ...]:
    """The splits of ``model`` (GgufLayoutError when it cannot be cut: not a GGUF this reader
    knows, no tensors, two tensors at one offset, or already a split model)."""
    with open(model, "rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:
            raise GgufLayoutError("the file is empty") from exc
        with data:
            header = read_header(data)
            metadata = (
                bytes(data[header.entries[0] : header.infos_start]) if header.entries else b""
            )
            return splits_of(header, metadata, len(data), elements=elements)


def splits_of(
    header: GgufHeader, metadata: bytes, size: int, *, elements: int
) -> tuple[GgufSplit, ...]:
    """:func:`plan` of a parsed header, its metadata entries' bytes and the file's size."""
    if any(key.startswith(b"split.") for key in header.keys):
        raise GgufLayoutError("the model is a split model already")
    order = sorted(header.tensors, key=lambda tensor: tensor.offset)
    if not order:
        raise GgufLayoutError("the model has no tensors")
    ends = [tensor.offset for tensor in order[1:]] + [size - header.data_start]
    if any(end <= tensor.offset for tensor, end in zip(order, ends, strict=True)):
        raise GgufLayoutError("two tensors share an offset")
    groups: list[list[int]] = []
    in_run = False
    for index, tensor in enumerate(order):
        small = math.prod(tensor.dims) < elements
        if small and in_run:
            groups[-1].append(index)
            continue
        in_run = small
        groups.append([index])
    count = len(groups) + 1
    if count > MAX_SPLITS:
        raise GgufLayoutError(f"{count} splits are more than llama.cpp's names allow")
    first = _gguf(
        header.version,
        header.alignment,
        len(header.keys) + 3,
        metadata
        + _entry(SPLIT_NO, UINT16, "<H", 0)
        + _entry(SPLIT_COUNT, UINT16, "<H", count)
        + _entry(SPLIT_TENSORS, INT32, "<i", len(order)),
        [],
    )
    splits = [GgufSplit(first, 0, 0, ())]
    for number, group in enumerate(groups, start=1):
        start = order[group[0]].offset
        entries = _entry(SPLIT_NO, UINT16, "<H", number)
        keys = 1
        if header.alignment != DEFAULT_ALIGNMENT:
            entries += _entry(ALIGNMENT_KEY.encode(), UINT32, "<I", header.alignment)
            keys += 1
        infos = [order[index] for index in group]
        split = _gguf(header.version, header.alignment, keys, entries, infos, base=start)
        starts = tuple(tensor.offset - start for tensor in infos)
        splits.append(GgufSplit(split, header.data_start + start, ends[group[-1]] - start, starts))
    return tuple(splits)


def _entry(key: bytes, kind: int, fmt: str, value: int) -> bytes:
    return struct.pack("<Q", len(key)) + key + struct.pack("<I", kind) + struct.pack(fmt, value)


def _gguf(
    version: int,
    alignment: int,
    keys: int,
    entries: bytes,
    tensors: Sequence[GgufTensor],
    *,
    base: int = 0,
) -> bytes:
    """A GGUF header: the counts, ``entries`` (``keys`` of them), the tensor infos with offsets
    from ``base``, zero padding up to the alignment."""
    out = bytearray(MAGIC + struct.pack("<IQQ", version, len(tensors), keys) + entries)
    for tensor in tensors:
        out += struct.pack("<Q", len(tensor.name)) + tensor.name
        out += struct.pack("<I", len(tensor.dims))
        out += b"".join(struct.pack("<Q", dim) for dim in tensor.dims)
        out += struct.pack("<IQ", tensor.kind, tensor.offset - base)
    out += bytes(-len(out) % alignment)
    return bytes(out)


def split_bytes(model: Path, split: GgufSplit) -> Iterator[bytes]:
    """The bytes of ``split``, a block at a time."""
    yield split.header
    with open(model, "rb") as handle:
        handle.seek(split.offset)
        left = split.size
        while left:
            block = handle.read(min(READ, left))
            if not block:
                raise GgufLayoutError(f"{model} is shorter than its tensors")
            left -= len(block)
            yield block


def split_pieces(
    model: Path, split: GgufSplit, cuts: list[int], *, small: int, largest: int
) -> tuple[str, list[tuple[str, int]]]:
    """The split's sha256 and its pieces (sha256, size), cut as models push cuts a model, from one
    read."""
    total = len(split.header) + split.size
    layout = spans([cut for cut in cuts if 0 < cut < total], total, small=small, largest=largest)
    whole = hashlib.sha256()
    pieces: list[tuple[str, int]] = []
    stream = ExactReader(split_bytes(model, split))
    for _, length in layout:
        data = stream(length)
        whole.update(data)
        pieces.append((hashlib.sha256(data).hexdigest(), length))
    return whole.hexdigest(), pieces


class ExactReader:
    """Reads exact byte counts from a stream of blocks."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks = blocks
        self.buffer = bytearray()

    def __call__(self, size: int) -> bytes:
        while len(self.buffer) < size:
            block = next(self.blocks, None)
            if block is None:
                raise GgufLayoutError("a split ended early")
            self.buffer += block
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data


def write_splits(model: Path, splits: Sequence[GgufSplit], folder: Path, prefix: str) -> list[Path]:
    """Write ``splits`` of ``model`` into ``folder`` under llama.cpp's names; their paths."""
    paths = []
    for index, split in enumerate(splits):
        path = folder / split_name(prefix, index, len(splits))
        with open(path, "wb") as out:
            for block in split_bytes(model, split):
                out.write(block)
        paths.append(path)
    return paths
