"""A GGUF file's header as kzbuild reads it, and the splits it cuts a model into."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufTensor:
    name: bytes
    dims: tuple[int, ...]
    kind: int  # the ggml type id
    offset: int  # from the start of the tensor data


@dataclass(frozen=True)
class GgufHeader:
    version: int
    entries: tuple[int, ...]  # where each metadata entry starts
    keys: tuple[bytes, ...]  # each entry's key
    infos_start: int  # where the tensor infos start (the end of the metadata)
    alignment: int
    tensors: tuple[GgufTensor, ...]
    data_start: int


@dataclass(frozen=True)
class GgufSplit:
    """One split of a model: its own GGUF header, then ``size`` bytes of the model's tensor data
    from byte ``offset`` of the model (nothing for the first split, which holds the metadata)."""

    header: bytes
    offset: int
    size: int
    starts: tuple[int, ...]  # where each of its tensors' data starts, from ``offset``
