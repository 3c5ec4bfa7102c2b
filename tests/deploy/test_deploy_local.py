"""The deploy flow on the local transport: incremental, atomic, resumable, rollback and keep."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kzbuild.build.artifacts import load_artifact
from kzbuild.device import deploy
from kzbuild.device.local import LocalTransport
from kzbuild.device.store import HARD, LINK_KIND, SYMBOLIC
from kzbuild.errors import DeviceError
from kzbuild.model.device import Device
from tests.fixtures_deploy import CuttingTransport, whole_chunks, write_manifest


def deployed(kz, device_root: Path, artifact: Path, *extra: str) -> dict:
    result = kz(
        "deploy", "--device", f"local:{device_root}", "--artifact", str(artifact), "--json", *extra
    )
    assert result.code == 0, result.err
    return json.loads(result.out)


def current_release(root: Path) -> str:
    return os.readlink(root / "current")


def run_hello(root: Path) -> str:
    return run_hello_in(root / "current")


def run_hello_in(release: Path) -> str:
    """The release's program run as upstream's scripts run one: LD_LIBRARY_PATH at its lib/ (its
    files are symlinks into the store, where $ORIGIN/../lib is no release's)."""
    return subprocess.run(
        [release / "bin" / "hello"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LD_LIBRARY_PATH": str(release / "lib")},
    ).stdout


def test_first_deploy_sends_everything_and_the_release_runs(kz, artifacts, tmp_path):
    build = artifacts.make("b1")
    root = tmp_path / "device"
    summary = deployed(kz, root, build)
    manifest = json.loads((build / "manifest.json").read_text())
    assert summary["files_sent"] == 3 and summary["files_skipped"] == 0
    assert summary["bytes_sent"] == sum(entry["size"] for entry in manifest["files"].values())
    assert current_release(root) == "releases/b1"
    assert run_hello(root) == "hello from v1\nblob 65536\n"
    # the release's files are hard links into the content store
    libblob = root / "releases" / "b1" / "lib" / "libblob.so"
    assert (
        libblob.stat().st_ino
        == (root / "objects" / manifest["files"]["lib/libblob.so"]["sha256"]).stat().st_ino
    )
    assert os.access(root / "current" / "bin" / "hello", os.X_OK)
    assert json.loads((root / "current" / "manifest.json").read_text()) == manifest
    assert list((root / "incoming").iterdir()) == []


def test_same_build_twice_sends_zero_bytes(kz, artifacts, tmp_path):
    build = artifacts.make("b1")
    root = tmp_path / "device"
    deployed(kz, root, build)
    again = deployed(kz, root, build)
    assert again["bytes_sent"] == 0 and again["files_sent"] == 0 and again["metadata_bytes"] == 0
    assert again["switched"] is False and again["files_skipped"] == 3


def test_one_changed_library_sends_at_most_its_bytes(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    deployed(kz, root, artifacts.make("b1"))
    build2 = artifacts.make("b2", greeting="hello from v2")
    summary = deployed(kz, root, build2)
    assert summary["files_sent"] == 1 and summary["files_skipped"] == 2
    assert 0 < summary["bytes_sent"] <= (build2 / "lib" / "libgreet.so").stat().st_size
    assert current_release(root) == "releases/b2"
    assert run_hello(root) == "hello from v2\nblob 65536\n"


def test_human_summary_names_counts_bytes_and_time(kz, artifacts, tmp_path):
    build = artifacts.make("b1")
    result = kz("deploy", "--device", f"local:{tmp_path / 'device'}", "--artifact", str(build))
    assert result.code == 0, result.err
    text = " ".join(result.out.split())
    assert "deployed b1 to local:" in text
    assert "sent 3 file(s)" in text and "skipped 0 already on the device" in text
    assert " s" in text.split("metadata")[1]
    again = " ".join(
        kz(
            "deploy", "--device", f"local:{tmp_path / 'device'}", "--artifact", str(build)
        ).out.split()
    )
    assert "b1 is already current" in again and "sent 0 file(s), 0 bytes" in again


def test_cut_deploy_keeps_current_and_the_next_one_resumes(artifacts, tmp_path):
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    deploy.deploy(LocalTransport(str(root)), device, load_artifact(artifacts.make("b1")))
    build2 = load_artifact(artifacts.make("b2", blob_seed=2, blob_size=512 * 1024))
    blob = next(entry for entry in build2.files if entry.path == "lib/libblob.so")
    with pytest.raises(DeviceError, match="connection lost"):
        deploy.deploy(CuttingTransport(str(root), budget=200 * 1024), device, build2)
    assert current_release(root) == "releases/b1"
    assert run_hello(root) == "hello from v1\nblob 65536\n"
    # chunks of libblob arrived in incoming/, the last one cut short
    arrived = sum(path.stat().st_size for path in (root / "incoming").iterdir() if path.is_file())
    assert 100 * 1024 < arrived < 200 * 1024
    assert not (root / "releases" / "b2").exists()
    whole = whole_chunks(root / "incoming", build2.path / blob.path)
    assert 0 < whole < arrived  # some chunks arrived whole, one was cut
    resumed = deploy.deploy(LocalTransport(str(root)), device, build2)
    assert resumed.bytes_resumed == whole  # only the chunk that was cut is sent again
    assert resumed.bytes_sent == blob.size - resumed.bytes_resumed
    assert current_release(root) == "releases/b2"
    assert run_hello(root) == "hello from v1\nblob 524288\n"


def test_a_corrupt_upload_is_caught_on_the_device_and_removed(artifacts, tmp_path):
    build = artifacts.make("b1")
    loaded = load_artifact(build)
    (build / "lib" / "libgreet.so").write_bytes(
        b"X" * (build / "lib" / "libgreet.so").stat().st_size
    )  # same size, other bytes
    root = tmp_path / "device"
    with pytest.raises(DeviceError) as caught:
        deploy.deploy(
            LocalTransport(str(root)), Device(name="t", transport="local", root=str(root)), loaded
        )
    assert (
        "sha256 mismatch on the device" in caught.value.message
        and "lib/libgreet.so" in caught.value.message
    )
    assert not (root / "current").exists()
    # the two good files are verified and stored: a rerun will not send them again
    assert (
        len(list((root / "objects").iterdir())) == 2 and list((root / "incoming").iterdir()) == []
    )


def test_rollback_switches_back_and_forth(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    deployed(kz, root, artifacts.make("b1"))
    deployed(kz, root, artifacts.make("b2", greeting="hello from v2"))
    result = kz("deploy", "--device", f"local:{root}", "--rollback")
    assert result.code == 0, result.err
    assert "rolled back" in result.out and "releases/b1" in result.out
    assert current_release(root) == "releases/b1"
    assert run_hello(root) == "hello from v1\nblob 65536\n"
    back = json.loads(kz("deploy", "--device", f"local:{root}", "--rollback", "--json").out)
    assert back == {"device": f"local:{root}", "release": "b2", "previous": "b1", "pruned": []}
    log = (root / "deploys.log").read_text().splitlines()
    assert [line.split("\t")[1:] for line in log] == [
        ["deploy", "b1"],
        ["deploy", "b2"],
        ["rollback", "b1"],
        ["rollback", "b2"],
    ]


def test_rollback_without_an_earlier_release_explains(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    empty = kz("deploy", "--device", f"local:{root}", "--rollback")
    assert empty.code == DeviceError.exit_code
    assert "nothing is deployed" in empty.err
    deployed(kz, root, artifacts.make("b1"))
    only = kz("deploy", "--device", f"local:{root}", "--rollback")
    assert only.code == DeviceError.exit_code
    assert "no earlier release to roll back to" in " ".join(only.err.split())


def test_keep_prunes_old_releases_and_their_unused_contents(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    for index in range(1, 4):
        deployed(kz, root, artifacts.make(f"b{index}", greeting=f"hello from v{index}"))
    summary = deployed(kz, root, artifacts.make("b4", greeting="hello from v4"), "--keep", "2")
    assert summary["pruned"] == ["b2", "b1"]
    assert sorted(p.name for p in (root / "releases").iterdir()) == ["b3", "b4"]
    # libgreet of v1 and v2 is gone from the store; hello and libblob (shared) stay
    assert len(list((root / "objects").iterdir())) == 4
    assert run_hello(root) == "hello from v4\nblob 65536\n"


def test_releases_hard_link_where_the_device_allows_it(kz, artifacts, tmp_path):
    """A hard link costs no inode (a symlink costs one: 10,000 files took seconds more) and keeps
    $ORIGIN the release's: the store uses them where the device allows, once it has tried."""
    root = tmp_path / "device"
    deployed(kz, root, artifacts.make("b1"))
    assert (root / LINK_KIND).read_text() == f"{HARD}\n"
    hello = root / "releases" / "b1" / "bin" / "hello"
    assert not hello.is_symlink() and hello.stat().st_nlink == 2


def test_a_store_of_hard_links_and_symlinks_alike_is_counted_pruned_and_rolled_back(
    kz, artifacts, tmp_path
):
    """A store whose kind changed (b1 made while it said symlinks, b2 with hard links): each
    release is read through its manifest, whatever its links are."""
    root = tmp_path / "device"
    root.mkdir()
    (root / LINK_KIND).write_text(f"{SYMBOLIC}\n")
    deployed(kz, root, artifacts.make("b1"))
    (root / LINK_KIND).write_text(f"{HARD}\n")
    deployed(kz, root, artifacts.make("b2", greeting="hello from v2"))
    assert (root / "releases" / "b1" / "bin" / "hello").is_symlink()
    assert not (root / "releases" / "b2" / "bin" / "hello").is_symlink()
    status = json.loads(kz("device", "status", "--device", f"local:{root}", "--json").out)
    holds = {release["name"]: release["holds"] for release in status["releases"]}
    for name in ("b1", "b2"):  # each content once, through its link of either kind
        files = (root / "releases" / name).rglob("*")
        assert holds[name] == sum(p.stat().st_size for p in files if p.is_file())
    verify = kz("device", "verify", "--device", f"local:{root}")
    assert verify.code == 0, verify.out
    summary = deployed(kz, root, artifacts.make("b3", greeting="hello from v3"), "--keep", "2")
    assert summary["pruned"] == ["b1"]
    assert len(list((root / "objects").iterdir())) == 4  # b1's own library went
    assert kz("deploy", "--device", f"local:{root}", "--rollback").code == 0
    assert run_hello(root) == "hello from v2\nblob 65536\n"


def test_while_a_release_has_no_readable_manifest_keep_removes_no_content(kz, artifacts, tmp_path):
    """Its links say what it holds only through its manifest: nothing it may hold is removed."""
    root = tmp_path / "device"
    deployed(kz, root, artifacts.make("b1"))
    deployed(kz, root, artifacts.make("b2", greeting="hello from v2"))
    (root / "releases" / "b2" / "manifest.json").write_text("{not json")
    before = sorted(p.name for p in (root / "objects").iterdir())
    result = kz(
        "deploy",
        "--device",
        f"local:{root}",
        "--artifact",
        str(artifacts.make("b3", greeting="v3")),
        "--keep",
        "2",
    )
    assert result.code == 0, result.err
    assert "release b2 has no readable manifest, so no content was removed" in result.err
    assert set(before) <= {p.name for p in (root / "objects").iterdir()}
    assert not (root / "releases" / "b1").exists()


def test_keep_counts_recency_not_names(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    deployed(kz, root, artifacts.make("b1"))
    deployed(kz, root, artifacts.make("b2", greeting="v2"))
    deployed(kz, root, artifacts.make("b1"))  # b1 again: now the most recent
    summary = deployed(kz, root, artifacts.make("b3", greeting="v3"), "--keep", "2")
    assert summary["pruned"] == ["b2"]
    assert current_release(root) == "releases/b3"


def test_keep_must_be_positive(kz, artifacts, tmp_path):
    result = kz(
        "deploy",
        "--device",
        f"local:{tmp_path / 'd'}",
        "--artifact",
        str(artifacts.make("b1")),
        "--keep",
        "0",
    )
    assert result.code == 2
    assert "Invalid value for '--keep'" in result.err
    # click words the range either way, depending on its version
    assert "x>=1" in result.err or "greater than or equal to 1" in result.err
    assert not (tmp_path / "d" / "current").exists()


def test_rollback_takes_no_artifact(kz, artifacts, tmp_path):
    result = kz("deploy", "--device", f"local:{tmp_path / 'd'}", "--artifact", "b1", "--rollback")
    assert result.code == 2
    assert "--rollback" in result.err and "no --artifact" in " ".join(result.err.split())


def test_a_rebuild_with_the_same_id_but_other_files_never_changes_the_current_release(
    kz, artifacts, tmp_path
):
    root = tmp_path / "device"
    deployed(kz, root, artifacts.make("b1"))
    summary = deployed(kz, root, artifacts.make("b1", greeting="not reproducible"))
    assert summary["release"].startswith("b1-") and summary["switched"] is True
    assert current_release(root) == f"releases/{summary['release']}"
    assert run_hello(root) == "not reproducible\nblob 65536\n"
    assert run_hello_in(root / "releases" / "b1") == "hello from v1\nblob 65536\n"


def test_duplicate_contents_are_sent_once(kz, artifacts, tmp_path):
    same = b"same bytes" * 1000
    build = artifacts.make("b1", extra={"lib/a.dat": same, "lib/b.dat": same})
    summary = deployed(kz, tmp_path / "device", build)
    assert summary["files_sent"] == 5
    assert summary["bytes_sent"] == sum(
        p.stat().st_size for p in build.rglob("*") if p.is_file() and p.name != "manifest.json"
    ) - len(same)


def test_paths_with_shell_characters_arrive_unchanged(kz, artifacts, tmp_path):
    build = artifacts.make(
        "b1",
        extra={
            "share/it's $(x) ADD|SUB;*.txt": b"quoted\n",
            'bin/it\'s a "tool"': b"#!/bin/sh\necho tool\n",
        },
    )
    (build / "bin" / 'it\'s a "tool"').chmod(0o755)
    write_manifest(build, "b1")
    root = tmp_path / "dev ice $(x)"
    deployed(kz, root, build)
    assert (root / "current" / "share" / "it's $(x) ADD|SUB;*.txt").read_bytes() == b"quoted\n"
    assert (
        subprocess.run(
            [root / "current" / "bin" / 'it\'s a "tool"'], capture_output=True, check=True
        ).stdout
        == b"tool\n"
    )


def test_the_recipes_newest_artifact_is_the_default(kz, project, artifacts, tmp_path):
    project.write(
        "recipes/demo-host.yaml",
        "description: d\nupstream:\n  remote: r\n  commit: "
        + "a" * 40
        + "\n  sources:\n    - git: file:///x\ndevice: local\n",
    )
    missing = kz("deploy")
    assert missing.code == 2
    assert "no artifact of recipe demo-host" in " ".join(missing.err.split())
    store = project.work / "artifacts"
    maker = type(artifacts)(store, artifacts.cache)
    maker.make("old", recipe="demo-host")
    maker.make("other", recipe="pad3-v79", greeting="other")
    newest = maker.make("new", recipe="demo-host", greeting="new")
    os.utime(newest / "manifest.json", (2_000_000_000, 2_000_000_000))
    result = kz("deploy", "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["build_id"] == "new"
    assert summary["device"] == f"local:{project.work / 'device'}"
    by_id = json.loads(kz("deploy", "--artifact", "old", "--json").out)
    assert by_id["build_id"] == "old"


def test_write_manifest_matches_the_loader(artifacts):
    build = artifacts.make("b1")
    write_manifest(build, "b1")
    assert load_artifact(build).build_id == "b1"


def test_progress_reports_bytes_per_file_up_to_the_total(artifacts, tmp_path):
    root = tmp_path / "device"
    build = load_artifact(artifacts.make("b1", blob_size=3 << 20))
    events = []
    result = deploy.deploy(
        LocalTransport(str(root)),
        Device(name="t", transport="local", root=str(root)),
        build,
        on_progress=events.append,
    )
    assert {event.total for event in events} == {result.bytes_sent}
    assert [event.done for event in events] == sorted(event.done for event in events)
    assert (
        events[-1].label == "verifying sha256 on the device"
        and events[-1].done == result.bytes_sent
    )
    assert {event.label for event in events[:-1]} == {
        "bin/hello",
        "lib/libblob.so",
        "lib/libgreet.so",
    }
    assert (
        len([event for event in events if event.label == "lib/libblob.so"]) > 2
    )  # several updates for a big file


def test_in_a_pipe_the_deploy_line_keeps_current_and_its_release_together(kz, artifacts, tmp_path):
    build = artifacts.make("host-0123456789abcdef")
    root = tmp_path / "a-device-root-with-a-long-name" / "data" / "local" / "tmp" / "kz-engine"
    result = kz("deploy", "--device", f"local:{root}", "--artifact", str(build))
    assert result.code == 0, result.err
    (line,) = [line for line in result.out.splitlines() if line.startswith("deployed ")]
    assert line.endswith(": current -> releases/host-0123456789abcdef (was nothing)")
