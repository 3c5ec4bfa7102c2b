"""`kzbuild models push`: content-addressed GGUF models on a device; resume, verify, never
resend."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.device import modelpush
from kzbuild.device.adb import AdbTransport
from kzbuild.device.local import LocalTransport
from kzbuild.errors import ConfigError, DeviceError
from kzbuild.model.device import Device
from tests.fixtures_deploy import CuttingTransport, pids_where


def write_gguf(path: Path, values: int = 200_000, seed: int = 0) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"kz-test-{seed}")
    writer.add_tensor(
        "blob", np.random.default_rng(seed).standard_normal(values).astype(np.float32)
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TENSOR_VALUES = 300_000  # 1.2 MB in f32: each tensor is a piece of its own


def write_model(path: Path, *, tensors: int, f16: int | None = None, seed: int = 0) -> Path:
    """A GGUF of ``tensors`` f32 tensors (tensor ``f16`` in f16), each with a small norm."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    for index in range(tensors):
        data = rng.standard_normal(TENSOR_VALUES).astype(np.float32)
        writer.add_tensor(f"blk.{index}.w", data.astype(np.float16) if index == f16 else data)
        writer.add_tensor(f"blk.{index}.norm", rng.standard_normal(64).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def push(kz, root: Path, model: Path, *extra: str) -> dict:
    result = kz("models", "push", str(model), "--device", f"local:{root}", "--json", *extra)
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_push_stores_by_content_with_a_readable_name_and_never_resends(kz, tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "device"
    first = push(kz, root, model)
    digest = sha256(model)
    assert first["sha256"] == digest and first["already_there"] is False
    assert first["bytes_sent"] == model.stat().st_size
    stored = root / "models" / f"{digest}.gguf"
    assert stored.read_bytes() == model.read_bytes()
    assert os.readlink(root / "models" / "tiny.gguf") == f"{digest}.gguf"
    again = push(kz, root, model)
    assert again["already_there"] is True and again["bytes_sent"] == 0
    renamed = push(kz, root, model, "--name", "qwen-tiny.gguf")
    assert renamed["bytes_sent"] == 0
    assert os.readlink(root / "models" / "qwen-tiny.gguf") == f"{digest}.gguf"


def test_a_name_moves_to_a_new_model(kz, tmp_path):
    root = tmp_path / "device"
    first = push(kz, root, write_gguf(tmp_path / "a.gguf", seed=1), "--name", "m.gguf")
    second = push(kz, root, write_gguf(tmp_path / "b.gguf", seed=2), "--name", "m.gguf")
    assert first["sha256"] != second["sha256"]
    assert os.readlink(root / "models" / "m.gguf") == f"{second['sha256']}.gguf"
    assert (root / "models" / f"{first['sha256']}.gguf").exists()


def test_human_output(kz, tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    out = " ".join(
        kz("models", "push", str(model), "--device", f"local:{tmp_path / 'd'}").out.split()
    )
    assert "pushed tiny.gguf" in out and "verified" in out
    out = " ".join(
        kz("models", "push", str(model), "--device", f"local:{tmp_path / 'd'}").out.split()
    )
    assert "already on" in out and "sent 0 bytes" in out


def test_a_cut_push_resumes_from_the_pieces_that_arrived(tmp_path):
    model = write_model(tmp_path / "m.gguf", tensors=4)
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    with pytest.raises(DeviceError, match="connection lost"):
        modelpush.push_model(CuttingTransport(str(root), budget=2_600_000), device, model)
    assert not (root / "models" / "m.gguf").exists()
    result = modelpush.push_model(LocalTransport(str(root)), device, model)
    arrived = 0
    for _, size in modelpush.cut(model):  # the pieces that went whole before the cut
        if arrived + size > 2_600_000:
            break
        arrived += size
    assert (result.bytes_resumed, result.bytes_sent) == (arrived, model.stat().st_size - arrived)
    assert (root / "models" / "m.gguf").read_bytes() == model.read_bytes()
    assert not list((root / "incoming").iterdir())


def cut_part(root: Path) -> Path:
    """What a cut direct push left of the model in its work dir: the checker's second name for
    the arriving file, or the copy it makes of that file once adbd removed it (where it may not
    link it: Android), or the arriving file itself if the checker had not linked it yet."""
    work = next((root / "incoming").glob(".kzm-*"))
    deadline = time.monotonic() + 10  # the checker copies as soon as it sees the file go
    while not (work / "part").exists() and not (work / modelpush.ARRIVING).exists():
        assert time.monotonic() < deadline, "the cut push left nothing"
        time.sleep(0.02)
    return work / "part" if (work / "part").exists() else work / modelpush.ARRIVING


def test_a_piece_that_rotted_in_a_cut_part_is_sent_again_with_what_follows(tmp_path):
    model = write_model(tmp_path / "m.gguf", tensors=4)
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    with pytest.raises(DeviceError, match="connection lost"):
        modelpush.push_model(CuttingTransport(str(root), budget=2_600_000), device, model)
    whole = [(o, s) for o, s in modelpush.cut(model) if o + s <= 2_600_000]
    rotten = max(whole, key=lambda span: span[1])  # the biggest piece that arrived whole
    part = cut_part(root)
    with open(part, "r+b") as handle:
        handle.seek(rotten[0] + rotten[1] // 2)
        handle.write(b"\xff\x00\xff")
        handle.seek(0, os.SEEK_END)
        handle.write(b"x" * 1000)  # and bytes past the cut that are no piece at all
    result = modelpush.push_model(LocalTransport(str(root)), device, model)
    assert (result.bytes_resumed, result.bytes_sent) == (
        rotten[0],
        model.stat().st_size - rotten[0],
    )
    assert (root / "models" / "m.gguf").read_bytes() == model.read_bytes()
    assert not list((root / "incoming").iterdir())


class CorruptingTransport(LocalTransport):
    """A local transport whose first push arrives with one byte flipped at ``at``."""

    def __init__(self, root: str, at: int) -> None:
        super().__init__(root)
        self.at: int | None = at

    def push(self, local: Path, remote: str, *, progress=None) -> None:  # type: ignore[no-untyped-def]
        if self.at is None:
            return super().push(local, remote, progress=progress)
        # the bytes land damaged (flipping them after the push would race the device's check of
        # the blocks as they arrive, and damage what was checked already: rot, not transport)
        data = bytearray(local.read_bytes())
        data[self.at] ^= 1
        damaged = local.with_name(local.name + ".damaged")
        damaged.write_bytes(data)
        self.at = None
        try:
            super().push(damaged, remote, progress=progress)
        finally:
            damaged.unlink()


@pytest.mark.parametrize("share", [0.1, 0.95])  # in a block checked as it came, in the last one
def test_a_direct_push_damaged_on_the_way_is_caught_before_it_is_stored(tmp_path, caplog, share):
    model = write_model(tmp_path / "m.gguf", tensors=6)
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    at = int(model.stat().st_size * share)
    result = modelpush.push_model(CorruptingTransport(str(root), at), device, model)
    assert "a block of m.gguf did not match its sha256" in caplog.text
    assert (root / "models" / "m.gguf").read_bytes() == model.read_bytes()
    spans = modelpush.cut(model)
    damaged = next(o for o, s in spans if o <= at < o + s)
    assert result.bytes_resumed == damaged  # the pieces before the damage were kept
    assert result.bytes_sent == 2 * model.stat().st_size - damaged  # the file, then the rest


@given(st.lists(st.integers(min_value=1, max_value=3 * modelpush.BLOCK), min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_check_blocks_are_runs_of_whole_pieces(sizes):
    layout = list(zip(itertools.accumulate([0, *sizes[:-1]]), sizes, strict=True))
    total = sum(sizes)
    blocks = modelpush.check_blocks(layout)
    starts = {offset for offset, _ in layout}
    assert [o for o, _ in blocks] == sorted(o for o, _ in blocks)
    assert sum(size for _, size in blocks) == total and blocks[0][0] == 0
    assert all(offset in starts for offset, _ in blocks)
    assert all(o + s == nxt for (o, s), (nxt, _) in itertools.pairwise(blocks))
    last = blocks[-1]
    assert last[1] * modelpush.TAIL_SHARE >= total
    # the last block is the shortest such run: one piece fewer would be too short
    assert (
        last[0] == 0
        or (last[1] - next(s for o, s in layout if o == last[0])) * modelpush.TAIL_SHARE < total
    )
    assert all(size >= modelpush.BLOCK for _, size in blocks[:-2])


def test_a_model_that_shares_tensors_sends_only_the_changed_one(tmp_path):
    first = write_model(tmp_path / "q8.gguf", tensors=4)
    variant = write_model(tmp_path / "q4.gguf", tensors=4, f16=2)
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    modelpush.push_model(LocalTransport(str(root)), device, first)
    result = modelpush.push_model(LocalTransport(str(root)), device, variant)
    changed = TENSOR_VALUES * 2  # tensor 2 in f16
    assert changed <= result.bytes_sent <= 1.2 * changed
    assert result.bytes_sent + result.bytes_reused == variant.stat().st_size
    assert (root / "models" / "q4.gguf").read_bytes() == variant.read_bytes()
    lists = sorted(p.name for p in (root / "models" / ".pieces").iterdir())
    assert lists == sorted([sha256(first), sha256(variant)])


def write_tensors(path: Path, tensors: list[np.ndarray]) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for index, data in enumerate(tensors):
        writer.add_tensor(f"blk.{index}.w", data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_piece_repeated_in_a_model_is_copied_out_of_its_own_part(tmp_path):
    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal(TENSOR_VALUES).astype(np.float32) for _ in range(3))
    first = write_tensors(tmp_path / "first.gguf", [a, b, c])
    again = write_tensors(tmp_path / "again.gguf", [a, b, a, a])
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    modelpush.push_model(LocalTransport(str(root)), device, first)
    result = modelpush.push_model(LocalTransport(str(root)), device, again)
    assert result.bytes_sent < TENSOR_VALUES  # the tensor infos: every tensor was copied
    assert result.bytes_reused >= 4 * TENSOR_VALUES * 4
    assert (root / "models" / "again.gguf").read_bytes() == again.read_bytes()


def test_a_damaged_model_on_the_device_is_not_copied_from(tmp_path, caplog):
    first = write_model(tmp_path / "a.gguf", tensors=3)
    variant = write_model(tmp_path / "b.gguf", tensors=3, f16=0)
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    modelpush.push_model(LocalTransport(str(root)), device, first)
    stored = root / "models" / f"{sha256(first)}.gguf"
    data = bytearray(stored.read_bytes())
    data[-100] ^= 0xFF  # in the last tensor, which the variant shares
    stored.write_bytes(bytes(data))
    result = modelpush.push_model(LocalTransport(str(root)), device, variant)
    assert "did not match its sha256" in caplog.text
    assert (root / "models" / "b.gguf").read_bytes() == variant.read_bytes()
    assert result.bytes_sent < variant.stat().st_size  # the pieces before the damage stayed


def test_cached_digests_skip_the_read_and_a_wrong_entry_is_caught_on_the_device(
    tmp_path, monkeypatch
):
    model = write_model(tmp_path / "m.gguf", tensors=3)
    cache = tmp_path / "cache.json"
    os.utime(model, (1_000_000_000, 1_000_000_000))  # long before it is hashed: not racy
    device = Device(name="t", transport="local", root=str(tmp_path / "d1"))
    first = modelpush.push_model(LocalTransport(device.root), device, model, cache=cache)
    entry = modelpush.DigestCache(cache).get(model)
    assert entry is not None and entry.sha256 == sha256(model) == first.sha256

    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed although the cache knew the model")

    with monkeypatch.context() as patched:
        patched.setattr(modelpush, "digest_pieces", no_hashing)
        device2 = Device(name="t", transport="local", root=str(tmp_path / "d2"))
        second = modelpush.push_model(LocalTransport(device2.root), device2, model, cache=cache)
    assert second.sha256 == first.sha256 and second.bytes_sent == model.stat().st_size

    # the file rewritten in place, its size and times as before (git's "racy" case, forced)
    stat = model.stat()
    other = write_model(tmp_path / "other.gguf", tensors=3, seed=9)
    model.write_bytes(other.read_bytes())
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    key = modelpush.DigestCache.key(model)
    texts = json.loads(cache.read_text())
    texts["entries"][key] = next(iter(texts["entries"].values()))  # the old entry, new ctime
    cache.write_text(json.dumps(texts))
    device3 = Device(name="t", transport="local", root=str(tmp_path / "d3"))
    third = modelpush.push_model(LocalTransport(device3.root), device3, model, cache=cache)
    assert third.sha256 == sha256(model) != first.sha256
    assert (tmp_path / "d3" / "models" / f"{third.sha256}.gguf").read_bytes() == model.read_bytes()
    assert modelpush.DigestCache(cache).get(model).sha256 == third.sha256  # type: ignore[union-attr]


def test_over_adb_a_cut_push_resumes_verified(adb_device, tmp_path):
    model = write_model(tmp_path / "m.gguf", tensors=6)
    device = adb_device.device()
    adb_device.faults.send_delay = 0.01  # a cable slower than loopback: the checker is there first
    adb_device.drop_send_after(model.stat().st_size * 7 // 8)  # in the last block
    with pytest.raises(DeviceError):
        modelpush.push_model(AdbTransport(device, connect_timeout=5), device, model)
    adb_device.faults.send_delay = 0.0
    part = cut_part(Path(adb_device.host_path(f"{device.root}")))
    done = part.parent / "done"
    checked = len(done.read_text().splitlines()) if done.exists() else 0
    whole = [(o, s) for o, s in modelpush.cut(model) if o + s <= part.stat().st_size]
    # whole before the cut but not checked yet, then rotted
    rotten = max(whole[checked:], key=lambda span: span[1])
    with open(part, "r+b") as handle:
        handle.seek(rotten[0])
        handle.write(b"\0" * rotten[1])
    result = modelpush.push_model(AdbTransport(device, connect_timeout=5), device, model)
    assert 0 < result.bytes_resumed == rotten[0]
    assert result.bytes_sent == model.stat().st_size - rotten[0]
    stored = Path(adb_device.host_path(f"{device.root}/models/m.gguf"))
    assert stored.read_bytes() == model.read_bytes()


def test_over_ssh(kz, sshd, ssh_home, tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "device"
    result = kz("models", "push", str(model), "--device", sshd.spec(root), "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["bytes_sent"] == model.stat().st_size
    assert (root / "models" / "tiny.gguf").read_bytes() == model.read_bytes()
    again = json.loads(kz("models", "push", str(model), "--device", sshd.spec(root), "--json").out)
    assert again["bytes_sent"] == 0


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        (b"not a model", None, "is not a GGUF model"),
        (None, None, "no model file"),
        (b"GGUF....", "sub/dir.gguf", "bad model name 'sub/dir.gguf'"),
        (b"GGUF....", ".hidden", "bad model name '.hidden'"),
        (b"GGUF....", "a" * 64 + ".gguf", "the store's own"),
    ],
)
def test_bad_inputs(kz, tmp_path, content, name, message):
    model = tmp_path / "m.gguf"
    if content is not None:
        model.write_bytes(content)
    args = ["models", "push", str(model), "--device", f"local:{tmp_path / 'd'}"] + (
        ["--name", name] if name else []
    )
    result = kz(*args)
    assert result.code == ConfigError.exit_code
    assert message in " ".join(result.err.split())


def test_in_a_pipe_the_stored_name_and_sha256_stay_on_one_line(kz, tmp_path):
    model = write_gguf(tmp_path / "a-model-with-a-rather-long-file-name-q4_0.gguf")
    root = tmp_path / "device-with-a-long-path" / "data" / "local" / "tmp" / "kz-engine"
    result = kz("models", "push", str(model), "--device", f"local:{root}")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert f"  {root}/models/{model.name} -> {sha256(model)}.gguf" in lines
    assert any(line.startswith("pushed ") and f"as {root}/models/" in line for line in lines)


def adb_push_children() -> list[int]:
    """The pids of this process's ``adb push`` children (the transfer kzbuild started)."""

    def adb_push(entry: Path) -> bool:
        parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        argv = (entry / "cmdline").read_bytes().split(b"\0")
        return parent == os.getpid() and b"push" in argv and argv[0].endswith(b"adb")

    return pids_where(adb_push)


def arrived(incoming: Path) -> int:
    """The bytes of the model on its way: its part, or the arriving file where the device may not
    link it as the part (Android), 0 before either is there."""
    sizes = [0]
    for work in incoming.glob(".kzm-*"):
        for name in ("part", modelpush.ARRIVING):
            with contextlib.suppress(OSError):
                sizes.append((work / name).stat().st_size)
    return max(sizes)


def test_over_adb_a_push_whose_adb_is_killed_resumes(adb_device, tmp_path):
    model = write_model(tmp_path / "m.gguf", tensors=6)
    device = adb_device.device()
    adb_device.faults.send_delay = 0.02  # a slow cable: the push takes a few seconds
    outcome: list[BaseException | None] = []

    def push() -> None:
        try:
            modelpush.push_model(AdbTransport(device, connect_timeout=5), device, model)
            outcome.append(None)
        except DeviceError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=push)
    thread.start()
    incoming = Path(adb_device.host_path(f"{device.root}/incoming"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if arrived(incoming) > 2 * TENSOR_VALUES * 4 and (pids := adb_push_children()):
            for pid in pids:
                os.kill(pid, signal.SIGKILL)  # adb killed mid-transfer
            break
        time.sleep(0.01)
    thread.join(60)
    assert outcome and isinstance(outcome[0], DeviceError), outcome
    adb_device.faults.send_delay = 0.0
    result = modelpush.push_model(AdbTransport(device, connect_timeout=5), device, model)
    assert result.bytes_resumed >= TENSOR_VALUES * 4  # the whole pieces that came before the kill
    assert result.bytes_sent + result.bytes_resumed == model.stat().st_size
    stored = Path(adb_device.host_path(f"{device.root}/models/m.gguf"))
    assert stored.read_bytes() == model.read_bytes()
