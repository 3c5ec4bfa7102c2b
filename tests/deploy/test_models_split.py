"""`kzbuild models push --split`: a model kept as GGUF splits, each split once on the device, so
quant variants that share tensors share their files (and llama.cpp still loads them)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.device import ggufsplit, modelpush, modelsplit
from kzbuild.device.adb import AdbTransport
from kzbuild.device.ggufcut import GgufLayoutError
from kzbuild.device.local import LocalTransport
from kzbuild.device.modelsplit import SplitModel
from kzbuild.errors import DeviceError
from kzbuild.measure.bench import device_model
from kzbuild.model.bench import DeviceModel
from kzbuild.model.device import Device
from tests.deploy.test_models_push import TENSOR_VALUES, sha256, write_model
from tests.fixtures_deploy import CuttingTransport

TYPES = {"f32": np.float32, "f16": np.float16}


def distinct_bytes(folder: Path, pattern: str = "**/*") -> int:
    """Bytes of the distinct files (inodes) under ``folder`` (its piece lists and manifests
    too, unless ``pattern`` leaves them out)."""
    inodes = {}
    for path in folder.glob(pattern):
        if path.is_file() and not path.is_symlink():
            inodes[path.stat().st_ino] = path.stat().st_size
    return sum(inodes.values())


def push(kz, root: Path, model: Path, *extra: str) -> dict:
    result = kz("models", "push", str(model), "--device", f"local:{root}", "--json", *extra)
    assert result.code == 0, result.err
    return json.loads(result.out)


def read(path: Path):
    import gguf

    return gguf.GGUFReader(str(path))


def tensors_of(paths: list[Path]) -> dict[str, tuple[tuple[int, ...], int, bytes]]:
    """Every tensor of the files (name -> shape, type, data bytes)."""
    found = {}
    for path in paths:
        for tensor in read(path).tensors:
            assert tensor.name not in found
            found[tensor.name] = (
                tuple(int(d) for d in tensor.shape),
                int(tensor.tensor_type),
                bytes(tensor.data.tobytes()),
            )
    return found


def value(reader, key: str):
    field = reader.fields[key]
    return field.parts[field.data[0]].tolist()[0]


def write_layout(path: Path, shapes: list[tuple[int, str]], alignment: int, seed: int) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment != 32:
        writer.add_custom_alignment(alignment)
    writer.add_name(f"layout-{seed}")
    for index, (count, kind) in enumerate(shapes):
        writer.add_tensor(f"t{index}", rng.standard_normal(count).astype(TYPES[kind]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(
        st.tuples(st.integers(1, 3000), st.sampled_from(sorted(TYPES))), min_size=1, max_size=12
    ),
    alignment=st.sampled_from([32, 64, 256]),
    elements=st.integers(0, 3000),
    changed=st.integers(0, 11),
)
def test_splits_hold_the_model_s_tensors_and_metadata(shapes, alignment, elements, changed):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        model = write_layout(root / "m.gguf", shapes, alignment, seed=1)
        splits = ggufsplit.plan(model, elements=elements)
        paths = ggufsplit.write_splits(model, splits, root, "s")
        assert [p.name for p in paths] == [
            f"s-{i:05d}-of-{len(splits):05d}.gguf" for i in range(1, len(splits) + 1)
        ]
        assert tensors_of(paths) == tensors_of([model])
        original, first = read(model), read(paths[0])
        assert {k for k in first.fields if not k.startswith(("GGUF.", "split."))} == {
            k for k in original.fields if not k.startswith("GGUF.")
        }
        assert value(first, "split.count") == len(splits)
        assert value(first, "split.tensors.count") == len(shapes)
        for index, path in enumerate(paths):
            reader = read(path)
            assert value(reader, "split.no") == index
            assert reader.alignment == alignment
            assert all(tensor.data_offset % alignment == 0 for tensor in reader.tensors)
        # a variant with one tensor in another type: every split but its own (and the first,
        # when the metadata differ) is the same bytes
        index = changed % len(shapes)
        other = list(shapes)
        other[index] = (shapes[index][0], "f16" if shapes[index][1] == "f32" else "f32")
        variant = write_layout(root / "v.gguf", other, alignment, seed=1)
        again = ggufsplit.plan(variant, elements=elements)
        assert len(again) == len(splits)
        differ = [
            i
            for i, (a, b) in enumerate(zip(splits, again, strict=True))
            if a.header != b.header
            or model.read_bytes()[a.offset : a.offset + a.size]
            != variant.read_bytes()[b.offset : b.offset + b.size]
        ]
        assert len(set(differ) - {0}) == 1  # the first holds the metadata, the same here


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"", "empty"), (b"GGUF\x03\x00\x00\x00" + b"\0" * 40, "no tensors"), (b"nope" * 8, "magic")],
)
def test_what_cannot_be_split_says_why(tmp_path, content, problem):
    model = tmp_path / "m.gguf"
    model.write_bytes(content)
    with pytest.raises(GgufLayoutError, match=problem):
        ggufsplit.plan(model)


def test_a_split_model_is_not_split_again(tmp_path):
    model = write_model(tmp_path / "m.gguf", tensors=2)
    first = ggufsplit.write_splits(model, ggufsplit.plan(model), tmp_path, "s")[0]
    with pytest.raises(GgufLayoutError, match="split model already"):
        ggufsplit.plan(first)


def test_two_variants_keep_one_copy_of_what_they_share(kz, tmp_path):
    root = tmp_path / "device"
    base = write_model(tmp_path / "q8.gguf", tensors=4)
    variant = write_model(tmp_path / "q4.gguf", tensors=4, f16=2)
    first = push(kz, root, base, "--split")
    assert first["bytes_sent"] >= 4 * TENSOR_VALUES * 4  # every tensor
    models = root / "models"
    alone = distinct_bytes(models)
    second = push(kz, root, variant, "--name", "v.gguf")  # split: it shares tensors with a split
    changed = TENSOR_VALUES * 2  # the f16 tensor
    assert second["bytes_sent"] <= 1.2 * changed
    assert second["bytes_reused"] == 0  # what the device holds is not copied into the part
    assert distinct_bytes(models) - alone <= 1.05 * changed  # the changed tensor + its headers
    # llama.cpp's names, symlinks into the store; the model's name leads to the first split
    names = sorted(p.name for p in models.glob(f"{second['sha256']}-*-of-*.gguf"))
    assert names == [f"{second['sha256']}-{i:05d}-of-00009.gguf" for i in range(1, 10)]
    first_split = models / names[0]
    assert (models / "v.gguf").resolve() == first_split.resolve()
    assert tensors_of(sorted(models.glob(f"{second['sha256']}-*"))) == tensors_of([variant])
    assert not list((root / "incoming").iterdir())
    device = Device(name="t", transport="local", root=str(root))
    # records name the model by the sha256 its push verified, read from the first split's name,
    # and tools open that first split, from which llama.cpp finds the others
    assert device_model(LocalTransport(str(root)), device, "models/v.gguf") == DeviceModel(
        sha256=second["sha256"], tool_path=str(models.resolve() / names[0])
    )

    report = json.loads(kz("device", "status", "--device", f"local:{root}", "--json").out)
    by_sha = {m["sha256"]: m for m in report["models"]}
    assert report["model_files"] == distinct_bytes(models, "*")
    assert by_sha[second["sha256"]]["splits"] == 9 and by_sha[second["sha256"]]["names"] == [
        "v.gguf"
    ]
    # each holds its own version of the tensor alone (the metadata are the same here)
    assert changed * 2 <= by_sha[first["sha256"]]["own"] <= changed * 2.01
    assert changed <= by_sha[second["sha256"]]["own"] <= changed * 1.01
    assert sum(m["size"] for m in report["models"]) > report["model_files"]  # shared, once

    again = push(kz, root, variant, "--name", "again.gguf")
    assert again["already_there"] and again["bytes_sent"] == 0
    verified = kz("device", "verify", "--device", f"local:{root}", "--json")
    assert verified.code == 0, verified.out
    assert json.loads(verified.out)["models"] == 2  # two models, whatever their splits


def test_verify_names_a_damaged_split_and_a_broken_link(kz, tmp_path):
    root = tmp_path / "device"
    model = write_model(tmp_path / "m.gguf", tensors=2)
    pushed = push(kz, root, model, "--split")
    models = root / "models"
    manifest = (models / ".splits" / pushed["sha256"]).read_text().split()
    split = models / f"{manifest[2]}.gguf"  # the second split: a tensor
    data = bytearray(split.read_bytes())
    data[-1] ^= 1
    os.chmod(split, 0o644)
    split.write_bytes(bytes(data))  # in place: every link to it rots with it
    last = models / f"{pushed['sha256']}-00005-of-00005.gguf"
    last.unlink()
    result = kz("device", "verify", "--device", f"local:{root}", "--json")
    assert result.code == 8
    damage = {(d["path"], d["kind"]) for d in json.loads(result.out)["damage"]}
    assert (f"models/{manifest[2]}.gguf", "model") in damage
    assert (f"models/{last.name}", "model") in damage


def test_a_split_that_does_not_check_out_is_not_stored_and_a_rerun_sends_it(tmp_path, monkeypatch):
    root = tmp_path / "device"
    model = write_model(tmp_path / "m.gguf", tensors=3)
    target = Device(name="t", transport="local", root=str(root))
    real = SplitModel.store
    calls = []

    def once_damaged(self, work, stored, *, part, sha256=None):
        if not calls:  # the first time, a header that does not match its split's sha256
            calls.append(1)
            bad = self.splits[2]
            garbage = bytes(len(bad.header))
            self.splits = (*self.splits[:2], replace(bad, header=garbage), *self.splits[3:])
        return real(self, work, stored, part=part, sha256=sha256)

    monkeypatch.setattr(SplitModel, "store", once_damaged)
    cache = tmp_path / "d.json"
    with pytest.raises(DeviceError, match="did not check out"):
        modelpush.push_model(LocalTransport(str(root)), target, model, split=True, cache=cache)
    assert not list((root / "models").glob("*-00001-of-*"))  # not stored
    result = modelpush.push_model(LocalTransport(str(root)), target, model, split=True, cache=cache)
    # the splits that checked out were stored: the rerun copies out of them, sends the bad one's
    assert 0 < result.bytes_sent <= 1.01 * TENSOR_VALUES * 4
    assert not list((root / "incoming").iterdir())
    assert tensors_of(sorted((root / "models").glob(f"{sha256(model)}-*"))) == tensors_of([model])


def test_over_adb(kz, adb_device, tmp_path):
    device = adb_device.device()
    base = write_model(tmp_path / "a.gguf", tensors=3)
    variant = write_model(tmp_path / "b.gguf", tensors=3, f16=1)
    models = Path(adb_device.host_path(f"{device.root}/models"))
    modelpush.push_model(AdbTransport(device, connect_timeout=5), device, base, split=True)
    alone = distinct_bytes(models)
    second = modelpush.push_model(
        AdbTransport(device, connect_timeout=5), device, variant, split=True
    )
    changed = TENSOR_VALUES * 2
    assert second.bytes_sent <= 1.2 * changed
    assert distinct_bytes(models) - alone <= 1.05 * changed
    transport = AdbTransport(device, connect_timeout=5)
    first = device_model(transport, device, "models/b.gguf").tool_path
    assert first.endswith(f"{second.sha256}-00001-of-00007.gguf")
    assert tensors_of(sorted(models.glob(f"{second.sha256}-*"))) == tensors_of([variant])
    spec = f"adb:{adb_device.serial}:{device.root}"
    verified = kz("device", "verify", "--device", spec, "--json")
    assert verified.code == 0, verified.out
    (models / f"{second.sha256}-00002-of-00007.gguf").unlink()
    damaged = json.loads(kz("device", "verify", "--device", spec, "--json").out)["damage"]
    assert [d["path"] for d in damaged] == [f"models/{second.sha256}-00002-of-00007.gguf"]
    report = json.loads(kz("device", "status", "--device", spec, "--json").out)
    assert report["model_files"] == distinct_bytes(models, "*")
    assert {m["splits"] for m in report["models"]} == {7}


def test_whole_keeps_one_file_and_split_names_are_the_store_s(kz, tmp_path):
    root = tmp_path / "device"
    base = write_model(tmp_path / "a.gguf", tensors=2)
    push(kz, root, base, "--split")
    variant = write_model(tmp_path / "b.gguf", tensors=2, f16=0)
    whole = push(kz, root, variant, "--whole")
    stored = root / "models" / f"{whole['sha256']}.gguf"
    assert not stored.is_symlink() and stored.read_bytes() == variant.read_bytes()
    other = write_model(tmp_path / "c.gguf", tensors=2, seed=5)  # shares nothing: one file
    alone = push(kz, root, other)
    assert not (root / "models" / f"{alone['sha256']}.gguf").is_symlink()
    bad = kz(
        "models",
        "push",
        str(base),
        "--device",
        f"local:{root}",
        "--name",
        f"{'a' * 64}-00001-of-00002.gguf",
    )
    assert bad.code == 2 and "the store's own" in bad.err


def test_over_ssh(kz, sshd, ssh_home, tmp_path):
    root = tmp_path / "device"
    base = write_model(tmp_path / "a.gguf", tensors=2)
    variant = write_model(tmp_path / "b.gguf", tensors=2, f16=1)
    spec = sshd.spec(root)
    first = kz("models", "push", str(base), "--device", spec, "--split", "--json")
    assert first.code == 0, first.err
    alone = distinct_bytes(root / "models")
    second = kz("models", "push", str(variant), "--device", spec, "--json")
    assert second.code == 0, second.err
    sha = json.loads(second.out)["sha256"]
    assert distinct_bytes(root / "models") - alone <= 1.05 * TENSOR_VALUES * 2
    assert tensors_of(sorted((root / "models").glob(f"{sha}-*"))) == tensors_of([variant])
    assert kz("device", "verify", "--device", spec).code == 0


def test_a_cut_split_push_resumes_from_what_arrived(tmp_path):
    root = tmp_path / "device"
    model = write_model(tmp_path / "m.gguf", tensors=4)
    target = Device(name="t", transport="local", root=str(root))
    cut = CuttingTransport(str(root), budget=model.stat().st_size // 2)
    with pytest.raises(DeviceError):
        modelpush.push_model(cut, target, model, split=True)
    assert not list((root / "models").glob("*-00001-of-*"))
    result = modelpush.push_model(LocalTransport(str(root)), target, model, split=True)
    assert result.bytes_resumed > 0
    # the tensors' data, once (the metadata and headers travel in the store step's small tar)
    assert abs(result.bytes_sent + result.bytes_resumed - model.stat().st_size) < 50_000
    assert tensors_of(sorted((root / "models").glob(f"{sha256(model)}-*"))) == tensors_of([model])


def test_a_store_cut_after_the_part_was_shortened_is_redone_from_a_fresh_part(
    tmp_path, monkeypatch
):
    root = tmp_path / "device"
    model = write_model(tmp_path / "m.gguf", tensors=4)
    target = Device(name="t", transport="local", root=str(root))
    real = modelsplit.STORE_SCRIPT
    # the device command dies once the part is cut down (as if adb were killed then)
    monkeypatch.setattr(
        modelsplit, "STORE_SCRIPT", real.replace("done < splits;", "done < splits; exit 1;")
    )
    with pytest.raises(DeviceError):
        modelpush.push_model(LocalTransport(str(root)), target, model, split=True)
    work = next((root / "incoming").glob(".kzm-*"))
    assert (work / "part").stat().st_size < model.stat().st_size and not (work / "done").exists()
    monkeypatch.setattr(modelsplit, "STORE_SCRIPT", real)
    result = modelpush.push_model(LocalTransport(str(root)), target, model, split=True)
    moved = result.bytes_sent + result.bytes_resumed + result.bytes_reused
    assert abs(moved - model.stat().st_size) < 50_000
    assert tensors_of(sorted((root / "models").glob(f"{sha256(model)}-*"))) == tensors_of([model])
    assert kz_verify_clean(root)


def kz_verify_clean(root: Path) -> bool:
    from kzbuild.device.integrity import verify_store
    from kzbuild.device.store import Layout, Remote

    return not verify_store(Remote(LocalTransport(str(root))), Layout(str(root))).damage


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(
        st.tuples(st.integers(1, 3000), st.sampled_from(sorted(TYPES))), min_size=1, max_size=8
    ),
    small=st.integers(1, 5000),
)
def test_a_split_s_pieces_tile_it_and_hash_to_its_bytes(shapes, small):
    import hashlib

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        model = write_layout(root / "m.gguf", shapes, 32, seed=2)
        splits = ggufsplit.plan(model, elements=0)
        paths = ggufsplit.write_splits(model, splits, root, "s")
        for split, path in zip(splits, paths, strict=True):
            data = path.read_bytes()
            sha, pieces = ggufsplit.split_pieces(
                model, split, modelsplit.split_cuts(split), small=small, largest=small * 3
            )
            assert sha == hashlib.sha256(data).hexdigest()
            assert all(size > 0 for _, size in pieces) and sum(s for _, s in pieces) == len(data)
            at = 0
            for digest, size in pieces:
                assert hashlib.sha256(data[at : at + size]).hexdigest() == digest
                at += size


def test_a_damaged_source_makes_a_second_pass_whose_splits_are_stored(tmp_path, caplog):
    first = write_model(tmp_path / "a.gguf", tensors=3)
    variant = write_model(tmp_path / "b.gguf", tensors=3, f16=0)
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    modelpush.push_model(LocalTransport(str(root)), device, first, split=False)
    stored = root / "models" / f"{sha256(first)}.gguf"
    data = bytearray(stored.read_bytes())
    data[-100] ^= 0xFF  # in the last tensor, which the variant shares
    stored.write_bytes(bytes(data))
    result = modelpush.push_model(LocalTransport(str(root)), device, variant, split=True)
    assert "did not match its sha256" in caplog.text  # then the whole model, read afresh
    assert result.sha256 == sha256(variant)
    assert tensors_of(sorted((root / "models").glob(f"{result.sha256}-*"))) == tensors_of([variant])
    assert not list((root / "incoming").iterdir())
