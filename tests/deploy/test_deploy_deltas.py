"""Deltas: a chunk the device lacks is built there from ranges of an older version's chunks and
the bytes that are new, then checked with its file like any chunk.

The recipes run in real shells (GNU's, and mksh with only toybox's applets, as on Android); the
deploys go to a local root (also with only mksh and toybox on PATH) and to the test sshd.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.build.artifacts import load_artifact
from kzbuild.device import deploy
from kzbuild.device.chunkstore import (
    DELTA_SCRIPT,
    FINE_HEX,
    Content,
    delta,
    parse_bases,
    signature,
    split,
)
from kzbuild.device.local import LocalTransport
from kzbuild.device.store import Upload
from kzbuild.model.device import Device
from tests.adbdevice.fs import DeviceFs
from tests.fixtures_deploy import assert_store_invariant, sha256, small_edit

SIZE = 2 << 20
NEW, OLD = "a" * 64, "b" * 64


def content_of(path: Path) -> Content:
    data = path.read_bytes()
    upload = Upload(str(path), sha256(path), len(data), 0o644, sha256(path), path.name)
    return Content(upload, split(path, len(data)))


def run_recipes(
    tmp_path: Path, old: Path, new: Path, env: dict[str, str] | None = None
) -> tuple[dict[str, bytes], int]:
    """Builds every chunk of ``new`` that ``old`` lacks with DELTA_SCRIPT, in a device-like dir
    (incoming/ next to chunks/ holding old's chunks). Returns the chunks built and the new bytes
    sent."""
    old_content, new_content = content_of(old), content_of(new)
    old_data, new_data = old.read_bytes(), new.read_bytes()
    lines = [f"= {NEW} {OLD}", *signature(old_content, old_data).decode().splitlines()]
    base = parse_bases(lines)[NEW]
    chunks, incoming = tmp_path / "chunks", tmp_path / "incoming"
    (incoming / ".kz-t" / "lit").mkdir(parents=True)
    chunks.mkdir()
    for piece in old_content.pieces:
        (chunks / piece.name).write_bytes(old_data[piece.offset : piece.offset + piece.size])
    recipes, literal, wanted = [], 0, {}
    for piece in new_content.pieces:
        if (chunks / piece.name).exists():
            continue
        data = memoryview(new_data)[piece.offset : piece.offset + piece.size]
        built = delta(piece.name, data, base, f".kz-t/lit/{piece.name}")
        if built is None:
            continue
        wanted[piece.name] = bytes(data)
        recipes.append(built.recipe)
        literal += len(built.literal)
        (incoming / ".kz-t" / "lit" / piece.name).write_bytes(built.literal)
    (incoming / ".kz-t" / "delta").write_text("".join(recipes))
    script = f'cd "$1" || exit 1; k=.kz-t; {DELTA_SCRIPT}'
    done = subprocess.run(
        ["sh", "-c", script, "kz", str(incoming)], capture_output=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return {name: (incoming / name).read_bytes() for name in wanted}, literal


def toybox_env(tmp_path: Path) -> dict[str, str]:
    """PATH with mksh as sh and toybox's applets only (the adb test device's userland)."""
    return {"PATH": str(DeviceFs(tmp_path / "toybox").bin)}


@pytest.mark.parametrize("userland", ["gnu", "toybox"])
def test_the_chunks_a_small_edit_changed_are_built_on_the_device_from_few_new_bytes(
    userland, tmp_path
):
    old, new = tmp_path / "old", tmp_path / "new"
    data = random.Random(1).randbytes(SIZE)
    old.write_bytes(data)
    new.write_bytes(small_edit(data, random.Random(2)))
    env = toybox_env(tmp_path) if userland == "toybox" else None
    built, literal = run_recipes(tmp_path / "device", old, new, env)
    assert len(built) >= 9  # each of the nine edits changed a chunk
    for name, chunk in built.items():
        assert hashlib.sha256(chunk).hexdigest().startswith(name)
    # 64-byte edits and a 4 KiB insertion: a few KiB each, not the chunks' ~80 KiB
    assert literal < 80 * 1024 < sum(map(len, built.values()))


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32),
    edits=st.lists(
        st.tuples(st.floats(0, 1), st.integers(0, 3), st.binary(max_size=5000)), max_size=6
    ),
)
def test_any_edit_builds_exactly_the_new_chunks(tmp_path_factory, seed, edits):
    """Deletions, insertions and replacements anywhere: each delta builds its chunk exactly."""
    tmp_path = tmp_path_factory.mktemp("edit")
    rng = random.Random(seed)
    data = rng.randbytes(rng.randint(70_000, 600_000))
    edited = bytearray(data)
    for where, kind, payload in edits:
        at = int(where * len(edited))
        cut = (0, 16, 3000, 70_000)[kind]
        edited[at : at + cut] = payload
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(data)
    new.write_bytes(bytes(edited))
    built, _ = run_recipes(tmp_path / "device", old, new)
    for name, chunk in built.items():
        assert hashlib.sha256(chunk).hexdigest().startswith(name)


@given(lines=st.lists(st.text(max_size=120), max_size=30))
def test_base_lines_that_do_not_parse_are_skipped(lines):
    bases = parse_bases(lines)
    for base in bases.values():
        for (digest, size), (chunk, offset) in base.pieces.items():
            assert len(digest) == FINE_HEX and 0 <= size <= 0xFFFF
            assert offset + size <= base.sizes[chunk]


@given(
    pieces=st.lists(st.tuples(st.text("0123456789abcdef", min_size=16, max_size=16)), max_size=5),
    noise=st.sampled_from(["", "x", " extra", "g" * 16]),
)
def test_a_base_line_with_a_bad_field_is_skipped_whole(pieces, noise):
    name = "a" * 32
    text = "".join(piece for (piece,) in pieces) + noise
    bases = parse_bases(["= " + "b" * 64 + " " + "c" * 64, f"{name} {text}"])
    base = bases["b" * 64]
    if noise or not pieces:
        assert base.sizes == {} and base.pieces == {}
    else:
        assert base.sizes[name] == sum(int(piece[FINE_HEX:], 16) for (piece,) in pieces)


def deploy_local(root: Path, artifact: Path) -> deploy.DeployResult:
    device = Device(name="t", transport="local", root=str(root))
    return deploy.deploy(LocalTransport(str(root)), device, load_artifact(artifact))


def edited_builds(artifacts, count: int = 3) -> list[Path]:
    """b1 with a 2 MiB library, then ``count - 1`` builds, each a small edit of the one before."""
    data = random.Random(7).randbytes(SIZE)
    builds = []
    for index in range(count):
        builds.append(artifacts.make(f"b{index + 1}", extra={"lib/libdata.so": data}))
        data = small_edit(data, random.Random(index))
    return builds


def object_of(build: Path) -> str:
    return json.loads((build / "manifest.json").read_text())["files"]["lib/libdata.so"]["sha256"]


@pytest.mark.parametrize("userland", ["gnu", "toybox"])
def test_each_small_edit_sends_a_delta_and_keeps_a_signature_for_the_next(
    userland, artifacts, tmp_path, monkeypatch
):
    if userland == "toybox":
        monkeypatch.setenv("PATH", toybox_env(tmp_path)["PATH"])
    root = tmp_path / "device"
    builds = edited_builds(artifacts)
    first = deploy_local(root, builds[0])
    assert first.bytes_sent > SIZE
    for build in builds[1:]:
        result = deploy_local(root, build)
        # nine edited spots of a few KiB each, against ~80 KiB chunks (about 750 KB) before
        assert result.files_sent == 1 and result.bytes_sent < 100_000, result
        assert assert_store_invariant(root) == build.name
        sig = (root / "signatures" / object_of(build)).read_text().splitlines()
        library = build / "lib/libdata.so"
        names = {piece.name for piece in split(library, library.stat().st_size)}
        assert {line.split()[0] for line in sig} == names  # a line for every chunk
    assert os.listdir(root / "incoming") == []


def test_over_ssh_a_small_edit_sends_a_delta(kz, sshd, ssh_home, artifacts, tmp_path):
    root = tmp_path / "device"
    builds = edited_builds(artifacts, 2)
    for build in builds:
        args = ["deploy", "--device", sshd.spec(root), "--artifact", str(build), "--json"]
        result = kz(*args)
        assert result.code == 0, result.err
    assert json.loads(result.out)["bytes_sent"] < 100_000
    assert assert_store_invariant(root) == "b2"


def test_prune_drops_the_signatures_of_objects_it_drops(artifacts, tmp_path):
    root = tmp_path / "device"
    builds = edited_builds(artifacts, 2)
    for build in builds:
        deploy_local(root, build)
    assert (root / "signatures" / object_of(builds[0])).exists()
    device = Device(name="t", transport="local", root=str(root))
    deploy.deploy(LocalTransport(str(root)), device, load_artifact(builds[1]), keep=1)
    left = os.listdir(root / "signatures")
    assert object_of(builds[1]) in left and object_of(builds[0]) not in left
    assert set(left) <= set(os.listdir(root / "objects"))


def test_over_adb_a_small_edit_sends_its_chunks_and_no_signatures(kz, adb_device, artifacts):
    root = "/data/local/tmp/kz-deltas"
    builds = edited_builds(artifacts, 2)
    sent = []
    for build in builds:
        args = ["deploy", "--device", f"adb:{adb_device.serial}:{root}", "--artifact", str(build)]
        result = kz(*args, "--json")
        assert result.code == 0, result.err
        sent.append(json.loads(result.out)["bytes_sent"])
    # the nine chunks around the edits, whole: no process per range on the device
    assert sent[1] > 9 * 16 * 1024
    host_root = adb_device.host_path(root)
    assert os.listdir(host_root / "signatures") == []
    assert assert_store_invariant(host_root) == "b2"
