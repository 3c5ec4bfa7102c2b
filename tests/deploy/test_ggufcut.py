"""Where a GGUF file is cut: at its metadata entries and tensors, or not at all (bad input)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.device.ggufcut import GgufLayoutError, boundaries, parse, spans


def write_gguf(path: Path, sizes: list[int]) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("cut")
    writer.add_token_list([f"t{i}" for i in range(50)])
    for index, size in enumerate(sizes):
        writer.add_tensor(f"t{index}", np.arange(size, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_cuts_are_gguf_s_own_tensor_offsets(tmp_path):
    import gguf

    model = write_gguf(tmp_path / "m.gguf", [100, 3, 5000, 1])
    cuts = boundaries(model)
    reader = gguf.GGUFReader(str(model))
    starts = {int(tensor.data_offset) for tensor in reader.tensors}
    assert starts <= set(cuts)
    fields = {
        field.offset for field in reader.fields.values() if not field.name.startswith("GGUF.")
    }
    assert fields <= set(cuts)  # every metadata entry starts a span
    assert cuts == sorted(set(cuts)) and 0 < cuts[0] and cuts[-1] < model.stat().st_size


def test_a_changed_tensor_type_leaves_the_other_pieces_alone(tmp_path):
    import gguf

    def model(path: Path, embd: np.ndarray) -> Path:
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_tensor("embd", embd)
        for index in range(3):
            writer.add_tensor(f"w{index}", np.full(70_000, index, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    embd = np.linspace(0, 1, 50_000, dtype=np.float32)
    pieces = []
    for path in (model(tmp_path / "a", embd), model(tmp_path / "b", embd.astype(np.float16))):
        data = path.read_bytes()
        layout = spans(boundaries(path), len(data), small=4096, largest=1 << 20)
        pieces.append({data[offset : offset + size] for offset, size in layout})
    common = pieces[0] & pieces[1]
    assert sum(map(len, common)) >= 3 * 70_000 * 4  # the three unchanged tensors


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_random_bytes_are_refused_or_cut_inside_the_file(data):
    try:
        cuts = parse(b"GGUF" + data)
    except GgufLayoutError:
        return
    assert all(0 < cut < len(data) + 4 for cut in cuts)


@pytest.fixture(scope="module")
def header(tmp_path_factory) -> bytes:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "h.gguf", [10, 20]).read_bytes()


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_damaged_header_is_refused_or_cut_inside_the_file(header, data):
    damaged = bytearray(header)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(damaged) - 1))
        damaged[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):  # a huge count or length somewhere
        at = data.draw(st.integers(0, len(damaged) - 8))
        damaged[at : at + 8] = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1)))
    damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    try:
        cuts = parse(bytes(damaged))
    except GgufLayoutError:
        return
    assert all(0 < cut < len(damaged) for cut in cuts)


@given(
    st.lists(st.integers(1, 5000), max_size=40, unique=True).map(sorted),
    st.integers(1, 3000),
    st.integers(1, 3000),
)
def test_pieces_tile_the_file(cuts, small, largest):
    size = (cuts[-1] if cuts else 0) + 1
    pieces = spans(cuts, size, small=small, largest=largest)
    assert [offset for offset, _ in pieces] == sorted({offset for offset, _ in pieces})
    assert sum(length for _, length in pieces) == size
    assert all(length > 0 for _, length in pieces)
    big = [(a, b - a) for a, b in zip([0, *cuts], [*cuts, size], strict=True) if b - a >= small]
    for start, length in big:  # a big span starts a piece and is cut only every `largest`
        assert start in {offset for offset, _ in pieces}
        assert all(0 < n <= largest for o, n in pieces if start <= o < start + length)
    inner = {start + k for start, length in big for k in range(largest, length, largest)}
    assert {offset for offset, _ in pieces} <= {0, *cuts} | inner  # no other cut is made


def test_an_empty_file_is_refused(tmp_path):
    (tmp_path / "e").write_bytes(b"")
    with pytest.raises(GgufLayoutError):
        boundaries(tmp_path / "e")
