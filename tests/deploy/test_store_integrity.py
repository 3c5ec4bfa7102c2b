"""The device store never holds or runs a wrong byte: hostile manifests are refused or made safe,
damage is found, refused by run and bench, and repaired by the next deploy, on local, ssh and
adb."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kzbuild.build.artifacts import load_artifact
from kzbuild.device import deploy
from kzbuild.device.integrity import verify_store
from kzbuild.device.local import LocalTransport
from kzbuild.device.store import Layout, Remote
from kzbuild.errors import ConfigError, DeviceError
from kzbuild.model.device import Device
from tests.fixtures_deploy import (
    ArtifactMaker,
    assert_store_invariant,
    flip_byte,
    sha256,
    write_manifest,
)

ADB_ROOT = "/data/local/tmp/kz-engine"


@dataclass(frozen=True)
class StoreDevice:
    spec: str  # what --device takes
    root: Path  # where the device root is on this disk


@pytest.fixture(params=["local", "ssh", "adb"])
def store_device(request: pytest.FixtureRequest, tmp_path: Path) -> StoreDevice:
    if request.param == "local":
        return StoreDevice(f"local:{tmp_path / 'device'}", tmp_path / "device")
    if request.param == "ssh":
        sshd = request.getfixturevalue("sshd")
        request.getfixturevalue("ssh_home")
        return StoreDevice(sshd.spec(tmp_path / "device"), tmp_path / "device")
    adb_device = request.getfixturevalue("adb_device")
    return StoreDevice(f"adb:{adb_device.serial}:{ADB_ROOT}", adb_device.host_path(ADB_ROOT))


def deployed(kz, spec: str, artifact: Path) -> dict:
    result = kz("deploy", "--device", spec, "--artifact", str(artifact), "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def says(text: str, phrase: str) -> bool:
    """Whether ``text`` holds ``phrase``, whitespace aside: rich wraps long lines, even mid-word."""
    return "".join(phrase.split()) in "".join(text.split())


def files_of(build: Path) -> dict:
    return json.loads((build / "manifest.json").read_text())["files"]


def rewrite(build: Path, change) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads((build / "manifest.json").read_text())
    change(doc)
    (build / "manifest.json").write_text(json.dumps(doc))


# --- damage: found, refused, repaired ---
def test_a_flipped_byte_is_found_refused_and_repaired(kz, store_device, artifacts):
    root, spec = store_device.root, store_device.spec
    build = artifacts.make("b1")
    first = deployed(kz, spec, build)
    assert first["repaired"] == []
    blob = files_of(build)["lib/libblob.so"]["sha256"]
    flip_byte(root / "objects" / blob)

    verify = kz("device", "verify", "--device", spec)
    assert verify.code == DeviceError.exit_code
    assert says(verify.out, f"damaged object {blob}: objects/{blob}") and says(
        verify.out, "damaged release b1: releases/b1/lib/libblob.so"
    )
    assert says(verify.out, f"expected {blob}") and says(verify.err, "damaged releases: b1")
    assert (root / "damaged" / "b1").exists()
    refused = kz("run", "--device", spec, "hello")
    assert refused.code == DeviceError.exit_code
    assert says(refused.err, "the current release b1 is damaged") and says(
        refused.err, "kzbuild deploy"
    )

    again = deployed(kz, spec, build)
    assert again["repaired"] == ["releases/b1/lib/libblob.so"]
    assert (again["switched"], again["files_sent"]) == (False, 0)
    assert_store_invariant(root)
    assert not (root / "damaged" / "b1").exists()
    intact = kz("device", "verify", "--device", spec)
    assert intact.code == 0, intact.err
    assert "all intact" in intact.out
    ran = kz("run", "--device", spec, "hello")
    assert ran.code == 0 and "hello from v1" in ran.out


def test_verify_json_lists_each_damaged_file(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    build = artifacts.make("b1")
    deployed(kz, f"local:{root}", build)
    greet = files_of(build)["lib/libgreet.so"]["sha256"]
    (root / "releases" / "b1" / "bin" / "hello").unlink()
    flip_byte(root / "objects" / greet)
    result = kz("device", "verify", "--device", f"local:{root}", "--json")
    assert result.code == DeviceError.exit_code
    report = json.loads(result.out)
    assert report["ok"] is False and report["damaged_releases"] == ["b1"]
    assert (report["objects"], report["releases"]) == (3, 1)
    found = {(entry["kind"], entry["path"], entry["found"]) for entry in report["damage"]}
    assert ("release", "releases/b1/bin/hello", "missing") in found
    assert ("object", f"objects/{greet}", sha256(root / "objects" / greet)) in found
    assert ("release", "releases/b1/lib/libgreet.so", sha256(root / "objects" / greet)) in found


def test_verify_checks_models_against_their_names(kz, tmp_path):
    root = tmp_path / "device"
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    assert kz("models", "push", str(model), "--device", f"local:{root}").code == 0
    assert kz("device", "verify", "--device", f"local:{root}").code == 0
    stored = root / "models" / f"{sha256(model)}.gguf"
    flip_byte(stored)
    result = kz("device", "verify", "--device", f"local:{root}")
    assert result.code == DeviceError.exit_code
    assert says(
        result.out,
        f"damaged model {stored.name}: models/{stored.name}: expected {sha256(model)}, found "
        f"{sha256(stored)}",
    )


def test_bench_refuses_a_damaged_current_release(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    build = artifacts.make("b1")
    deployed(kz, f"local:{root}", build)
    flip_byte(root / "objects" / files_of(build)["bin/hello"]["sha256"])
    assert kz("device", "verify", "--device", f"local:{root}").code == DeviceError.exit_code
    refused = kz("bench", "--device", f"local:{root}", "-m", "models/none.gguf")
    assert refused.code == DeviceError.exit_code
    assert says(refused.err, "the current release b1 is damaged")


def test_a_missing_release_file_is_damage_and_is_restored(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    build = artifacts.make("b1")
    deployed(kz, f"local:{root}", build)
    (root / "releases" / "b1" / "lib" / "libgreet.so").unlink()
    assert deployed(kz, f"local:{root}", build)["repaired"] == ["releases/b1/lib/libgreet.so"]
    assert_store_invariant(root)


def test_a_repair_relinks_every_release_holding_the_content(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    deployed(kz, f"local:{root}", artifacts.make("b1"))
    build2 = artifacts.make("b2", greeting="hello from v2")  # shares hello and libblob with b1
    blob = files_of(build2)["lib/libblob.so"]["sha256"]
    flip_byte(root / "objects" / blob)
    summary = deployed(kz, f"local:{root}", build2)
    assert summary["repaired"] == ["releases/b1/lib/libblob.so", "releases/b2/lib/libblob.so"]
    assert_store_invariant(root)
    human = kz("deploy", "--device", f"local:{root}", "--artifact", str(build2))
    assert human.code == 0 and "repaired" not in human.out  # nothing left to repair


def test_a_failed_repair_marks_the_release_and_a_good_deploy_clears_it(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    build = artifacts.make("b1")
    deployed(kz, f"local:{root}", build)
    greet = build / "lib" / "libgreet.so"
    flip_byte(root / "objects" / files_of(build)["lib/libgreet.so"]["sha256"])
    original = greet.read_bytes()
    greet.write_bytes(
        b"X" * len(original)
    )  # same size, other bytes: the repair's upload cannot verify
    failed = kz("deploy", "--device", f"local:{root}", "--artifact", str(build))
    assert failed.code == DeviceError.exit_code
    assert says(failed.err, "sha256 mismatch on the device")
    assert (root / "damaged" / "b1").exists()
    assert kz("run", "--device", f"local:{root}", "hello").code == DeviceError.exit_code
    greet.write_bytes(original)
    human = kz("deploy", "--device", f"local:{root}", "--artifact", str(build))
    assert human.code == 0, human.err
    assert says(human.out, "repaired 1 damaged file(s)") and says(
        human.out, "releases/b1/lib/libgreet.so"
    )
    assert not (root / "damaged" / "b1").exists()
    assert_store_invariant(root)


def test_a_partial_upload_with_other_links_is_never_appended_to(artifacts, tmp_path):
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    build1 = load_artifact(artifacts.make("b1", extra={"share/small.txt": b"x"}))
    deploy.deploy(LocalTransport(str(root)), device, build1)
    build2 = load_artifact(artifacts.make("b2", greeting="hello from v2"))
    new = build2.file("lib/libgreet.so")
    # a hard link in incoming/ under the name of the next upload, shorter than it: a resume
    # would append through it
    os.link(
        root / "objects" / build1.file("share/small.txt").sha256, root / "incoming" / new.sha256
    )
    deploy.deploy(LocalTransport(str(root)), device, build2)
    assert_store_invariant(root)


# --- hostile manifests: refused with a message, or made safe; the store stays sound ---
def test_manifest_listed_among_the_files_is_refused(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    deployed(kz, f"local:{root}", artifacts.make("b0"))
    build = artifacts.make("b1")
    greet = files_of(build)["lib/libgreet.so"]
    rewrite(build, lambda doc: doc["files"].update({"manifest.json": greet}))
    result = kz("deploy", "--device", f"local:{root}", "--artifact", str(build))
    assert result.code == ConfigError.exit_code
    assert says(
        result.err,
        f"{build / 'manifest.json'}: files: 'manifest.json': 'manifest.json' is the release's own "
        "manifest",
    )
    assert_store_invariant(root)
    assert os.readlink(root / "current") == "releases/b0"


@pytest.mark.parametrize(
    ("link", "target", "listed"),
    [
        ("lib/libx.so", "/etc/passwd", "lib/libx.so"),  # the file is a symlink out of the artifact
        ("share", "/etc", "share/passwd"),  # a parent dir is
        ("lib/liby.so", "libgreet.so", "lib/liby.so"),  # even one inside the artifact
    ],
)
def test_symlinks_in_an_artifact_are_refused(kz, artifacts, tmp_path, link, target, listed):
    root = tmp_path / "device"
    deployed(kz, f"local:{root}", artifacts.make("b0"))
    build = artifacts.make("b1")
    (build / link).symlink_to(target)
    real = (build / listed).resolve()
    rewrite(
        build,
        lambda doc: doc["files"].update(
            {listed: {"sha256": sha256(real), "size": real.stat().st_size, "mode": "0644"}}
        ),
    )
    result = kz("deploy", "--device", f"local:{root}", "--artifact", str(build))
    assert result.code == ConfigError.exit_code
    assert says(result.err, f"files: '{listed}': {build / link} is a symlink")
    assert_store_invariant(root)
    assert not (root / "releases" / "b1").exists()


def test_setuid_and_odd_modes_are_masked(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    build = artifacts.make(
        "b1", extra={"bin/suid": b"#!/bin/sh\n", "lib/sticky.dat": b"s", "lib/writable.dat": b"w"}
    )
    os.chmod(build / "bin" / "suid", 0o6755)
    os.chmod(build / "lib" / "sticky.dat", 0o1644)
    os.chmod(build / "lib" / "writable.dat", 0o666)
    write_manifest(build, "b1")
    assert files_of(build)["bin/suid"]["mode"] == "6755"
    deployed(kz, f"local:{root}", build)
    release = root / "releases" / "b1"
    modes = {
        rel: (release / rel).stat().st_mode & 0o7777
        for rel in ("bin/suid", "lib/sticky.dat", "lib/writable.dat", "bin/hello")
    }
    assert modes == {
        "bin/suid": 0o755,
        "lib/sticky.dat": 0o644,
        "lib/writable.dat": 0o644,
        "bin/hello": 0o755,
    }
    assert_store_invariant(root)


def test_duplicate_contents_with_different_modes_share_one_sound_object(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    same = b"#!/bin/sh\necho same\n"
    build = artifacts.make("b1", extra={"bin/same": same, "share/same.txt": same})
    os.chmod(build / "bin" / "same", 0o755)
    os.chmod(build / "share" / "same.txt", 0o644)
    write_manifest(build, "b1")
    deployed(kz, f"local:{root}", build)
    assert os.access(root / "current" / "bin" / "same", os.X_OK)
    assert deployed(kz, f"local:{root}", build)["repaired"] == []
    assert_store_invariant(root)


def test_a_content_stored_as_data_becomes_executable_when_a_release_needs_it(
    kz, artifacts, tmp_path
):
    root = tmp_path / "device"
    tool = b"#!/bin/sh\necho tool\n"
    deployed(kz, f"local:{root}", artifacts.make("b1", extra={"share/tool.txt": tool}))
    build2 = artifacts.make("b2", extra={"bin/tool": tool})
    os.chmod(build2 / "bin" / "tool", 0o755)
    write_manifest(build2, "b2")
    deployed(kz, f"local:{root}", build2)
    assert os.access(root / "current" / "bin" / "tool", os.X_OK)
    flip_byte(root / "objects" / sha256(build2 / "bin" / "tool"), 3)
    deployed(
        kz, f"local:{root}", artifacts.make("b1", extra={"share/tool.txt": tool})
    )  # b1 repairs it, 0644 in b1 only
    assert_store_invariant(root)  # b2's bin/tool is still executable


@pytest.mark.parametrize(
    "build_id",
    ["a/b", "..", ".hidden", "x\ny", "a b", "-rf", "", "b\u00e9", "x" * 129, "$(id)", "a\tb"],
)
def test_odd_build_ids_are_refused(kz, artifacts, tmp_path, build_id):
    build = artifacts.make("b1")
    rewrite(build, lambda doc: doc.update(build_id=build_id))
    result = kz("deploy", "--device", f"local:{tmp_path / 'device'}", "--artifact", str(build))
    assert result.code == ConfigError.exit_code
    assert says(result.err, f"{build / 'manifest.json'}: build_id: must be 1-128 letters")
    assert not (tmp_path / "device" / "releases").exists() or not any(
        (tmp_path / "device" / "releases").iterdir()
    )


def test_a_relative_device_root_is_refused(kz, project, artifacts):
    build = artifacts.make("b1")
    project.write(
        "recipes/devices.yaml", "devices:\n  box:\n    transport: local\n    root: rel/dir\n"
    )
    named = kz("deploy", "--device", "box", "--artifact", str(build))
    assert named.code == ConfigError.exit_code
    assert says(named.err, "devices.yaml:4: root: device box: 'rel/dir' is not an absolute path")
    adhoc = kz("deploy", "--device", "local:rel/dir", "--artifact", str(build))
    assert adhoc.code == ConfigError.exit_code
    assert says(adhoc.err, "bad local device spec 'local:rel/dir'")
    assert not (project.root / "rel").exists()


# --- generated manifests: whatever they say, a clean exit code and a sound store ---
SAFE_BUILD_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,20}", fullmatch=True)
HOSTILE_PATHS = st.sampled_from(
    [
        "manifest.json",
        "manifest.json/x",
        "../x",
        "lib/../../x",
        "/etc/passwd",
        "",
        ".",
        "a\nb",
        "lib/",
        "bin//hello",
        "lib/libx.so",
        "share/passwd",
        "bin",
    ]
)
MODES = st.one_of(
    st.integers(-1, 0o10000), st.sampled_from(["4755", "0777", "1644", "rwx", "0o755", "06755"])
)


@st.composite
def hostile_manifests(draw: st.DrawFn, real: dict) -> dict:
    """A manifest mixing the artifact's real entries (modes and paths bent) with hostile ones."""
    files: dict = {}
    for rel, entry in real.items():
        if draw(st.booleans()):
            files[rel] = {**entry, "mode": draw(MODES)} if draw(st.booleans()) else entry
    for _ in range(draw(st.integers(0, 3))):
        entry = draw(st.sampled_from(list(real.values())))
        files[draw(st.one_of(HOSTILE_PATHS, st.sampled_from(list(real)), st.text(max_size=12)))] = {
            **entry,
            "mode": draw(MODES),
            "sha256": draw(st.sampled_from([entry["sha256"], "0" * 64, "XYZ"])),
        }
    build_id = draw(
        st.one_of(
            SAFE_BUILD_IDS,
            st.text(max_size=20),
            st.sampled_from(["../up", "a/b", "x\ny", ".staging-x"]),
        )
    )
    return {"build_id": build_id, "files": files, "recipe": draw(st.sampled_from([None, "r", 3]))}


@pytest.fixture
def hostile_artifact(artifacts: ArtifactMaker) -> tuple[Path, dict]:
    """An artifact dir with symlinks to host files, and its true manifest entries (each example
    rewrites the manifest)."""
    build = artifacts.make("b1", extra={"share/data.txt": b"data\n"})
    (build / "lib" / "libx.so").symlink_to("/etc/passwd")
    (build / "share" / "passwd").symlink_to("/etc/passwd")
    return build, files_of(build)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_generated_hostile_manifests_exit_cleanly_and_keep_the_store_sound(
    kz, hostile_artifact, tmp_path, data
):
    build, real = hostile_artifact
    (build / "manifest.json").write_text(json.dumps(data.draw(hostile_manifests(real))))
    root = tmp_path / "device"
    result = kz("deploy", "--device", f"local:{root}", "--artifact", str(build), "--json")
    event(f"exit {result.code}")  # --hypothesis-show-statistics shows how many examples got how far
    assert result.code == 0 or 2 <= result.code <= 13, result.err
    assert "Traceback" not in result.err + result.out and "internal error" not in result.err
    if root.exists():
        assert_store_invariant(root)


class CountingTransport(LocalTransport):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.calls: list[str] = []
        self.argvs: list[list[str]] = []

    def run(self, argv, **options):  # type: ignore[no-untyped-def]
        self.calls.append(argv[0])
        self.argvs.append(list(argv))
        return super().run(argv, **options)

    def hashed(self) -> list[str]:
        """The paths sha256sum was given, relative to the root, chunks aside."""
        paths = [
            os.path.relpath(path, self.root)
            for argv in self.argvs
            if argv[0] == "sha256sum"
            for path in argv[1:]
        ]
        return [path for path in paths if not path.startswith("chunks/")]


def test_a_no_op_redeploy_verifies_in_one_extra_round_trip(artifacts, tmp_path):
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    build = load_artifact(artifacts.make("b1"))
    deploy.deploy(LocalTransport(str(root)), device, build)
    counting = CountingTransport(str(root))
    assert deploy.deploy(counting, device, build).repaired == ()
    # the lock taken with the state read in the same command, the release's manifest, every
    # file hashed at once, the unlock
    assert counting.calls == ["sh", "cat", "sha256sum", "sh"], counting.calls


def test_verify_hashes_each_content_once_and_a_release_file_that_is_not_a_link_itself(
    artifacts, tmp_path
):
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    for build_id, greeting in (("b1", "hello from v1"), ("b2", "hello from v2")):
        build = load_artifact(artifacts.make(build_id, greeting=greeting))
        deploy.deploy(LocalTransport(str(root)), device, build)  # b2 shares b1's library
    objects = sorted(f"objects/{path.name}" for path in (root / "objects").iterdir())
    counting = CountingTransport(str(root))
    report = verify_store(Remote(counting), Layout(str(root)))
    assert report.damage == () and sorted(counting.hashed()) == objects  # each once, no release

    library = files_of(artifacts.root / "b1")["lib/libblob.so"]["sha256"]
    copied = root / "releases/b1/lib/libblob.so"
    copied.unlink()
    copied.write_bytes((root / "objects" / library).read_bytes())  # the same bytes, no link
    flip_byte(root / "objects" / library)
    counting = CountingTransport(str(root))
    report = verify_store(Remote(counting), Layout(str(root)))
    assert sorted(counting.hashed()) == sorted([*objects, "releases/b1/lib/libblob.so"])
    assert sorted((d.kind, d.path) for d in report.damage) == [
        ("object", f"objects/{library}"),
        ("release", "releases/b2/lib/libblob.so"),  # through its link; b1's copy is intact
    ]
    assert all(d.found != library for d in report.damage)


def test_keep_removes_what_cut_deploys_left_behind(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    build = artifacts.make("b1")
    deployed(kz, f"local:{root}", build)
    stale = root / "releases" / ".staging-b2-0badf00d"
    (stale / "lib").mkdir(parents=True)
    os.link(
        root / "releases" / "b1" / "lib" / "libgreet.so", stale / "lib" / "libgreet.so"
    )  # would keep the content alive
    (root / "incoming" / "manifest.json-0badf00d").write_text("{}")
    result = kz("deploy", "--device", f"local:{root}", "--artifact", str(build), "--keep", "1")
    assert result.code == 0, result.err
    assert sorted(p.name for p in (root / "releases").iterdir()) == ["b1"]
    assert list((root / "incoming").iterdir()) == []
    assert_store_invariant(root)


def test_a_listing_cut_short_is_an_error_not_a_listing():
    """A device answer that lost its tail (a dropped connection, a killed shell) must not read as a
    store with less in it."""
    from kzbuild.device.base import RemoteResult
    from kzbuild.device.store import parse_inventory, parse_state, sections
    from kzbuild.errors import DeviceError

    assert sections(["a", "/", "b", "/", "c", "/", "d"], 3, what="x") == [
        ["a"],
        ["b"],
        ["c", "/", "d"],
    ]
    assert sections(["/", "/"], 3, what="x") == [[], [], []]
    with pytest.raises(DeviceError, match="cut short"):
        sections(["a", "/", "b"], 3, what="listing the content store")
    with pytest.raises(
        DeviceError, match="reading the device state: the device's answer was cut short"
    ):
        parse_state(RemoteResult(0, b"releases/r1\nr1\nr2\n", b""))
    with pytest.raises(DeviceError, match="listing the content store"):
        parse_inventory(RemoteResult(0, b"abc\n", b""), "chunks")
    inventory = parse_inventory(RemoteResult(0, b"abc\n/\n12 partial\n/\n", b""), "chunks")
    assert (
        inventory.stored == {"abc"}
        and inventory.partial == {"partial": 12}
        and inventory.other_empty
    )
