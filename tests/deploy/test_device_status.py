"""``kzbuild device status``: the space releases and models hold, and what --keep N frees."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.deploy.test_models_push import write_model


def stored_bytes(root: Path) -> int:
    """Bytes of the distinct files under the releases, contents and chunks of a device root."""
    inodes = {}
    for top in ("releases", "objects", "chunks"):
        for path in (root / top).rglob("*"):
            if path.is_file() and not path.is_symlink():
                inodes[path.stat().st_ino] = path.stat().st_size
    return sum(inodes.values())


def status(kz, root: Path) -> dict:
    result = kz("device", "status", "--device", f"local:{root}", "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_status_counts_shared_contents_once_and_predicts_what_keep_frees(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    builds = [
        artifacts.make("b1", blob_size=300_000),
        artifacts.make("b2", greeting="hello from v2", blob_size=300_000),
        artifacts.make("b3", greeting="hello from v2", blob_seed=2, blob_size=300_000),
    ]
    for build in builds:
        result = kz("deploy", "--device", f"local:{root}", "--artifact", str(build), "--json")
        assert result.code == 0, result.err
    model = write_model(tmp_path / "m.gguf", tensors=2)
    for name in ("a.gguf", "b.gguf"):
        pushed = kz("models", "push", str(model), "--device", f"local:{root}", "--name", name)
        assert pushed.code == 0, pushed.err

    report = status(kz, root)
    assert [r["name"] for r in report["releases"]] == ["b3", "b2", "b1"]
    assert [r["current"] for r in report["releases"]] == [True, False, False]
    contents: dict[str, int] = {}
    for build in builds:
        files = json.loads((build / "manifest.json").read_text())["files"]
        contents |= {entry["sha256"]: entry["size"] for entry in files.values()}
        release = next(r for r in report["releases"] if r["name"] == build.name)
        manifest = (root / "releases" / build.name / "manifest.json").stat().st_size
        distinct = {entry["sha256"]: entry["size"] for entry in files.values()}
        assert release["holds"] == sum(distinct.values()) + manifest
    assert report["contents"] == sum(contents.values())  # shared contents once
    b1 = next(r for r in report["releases"] if r["name"] == "b1")
    greet_v1 = (builds[0] / "lib" / "libgreet.so").stat().st_size
    b1_manifest = (root / "releases" / "b1" / "manifest.json").stat().st_size
    assert b1["own"] == greet_v1 + b1_manifest  # hello and libblob are shared with b2
    assert report["models"] == [
        {
            "sha256": report["models"][0]["sha256"],
            "size": model.stat().st_size,
            "names": ["a.gguf", "b.gguf"],
            "own": model.stat().st_size,
            "splits": 1,
        }
    ]
    assert report["model_files"] == model.stat().st_size
    assert report["chunks"] > 0 and report["total"] > report["contents"]

    assert [(k["keep"], k["removes"]) for k in report["keeps"]] == [(1, ["b2", "b1"]), (2, ["b1"])]


def test_keep_frees_exactly_what_prune_removes(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    builds = [
        artifacts.make("c1", blob_size=300_000),
        artifacts.make("c2", greeting="v2", blob_seed=3, blob_size=300_000),
    ]
    for build in builds:
        assert kz("deploy", "--device", f"local:{root}", "--artifact", str(build)).code == 0
    (root / "objects" / ("0" * 64)).write_bytes(os.urandom(1000))  # unused: prune drops it too
    report = status(kz, root)
    predicted = next(k for k in report["keeps"] if k["keep"] == 1)
    assert predicted["removes"] == ["c1"]
    before = stored_bytes(root)
    again = kz("deploy", "--device", f"local:{root}", "--artifact", str(builds[1]), "--keep", "1")
    assert again.code == 0, again.err
    assert before - stored_bytes(root) == predicted["frees"]


def test_human_output(kz, artifacts, tmp_path):
    root = tmp_path / "device"
    assert (
        kz("deploy", "--device", f"local:{root}", "--artifact", str(artifacts.make("h1"))).code == 0
    )
    result = kz("device", "status", "--device", f"local:{root}")
    assert result.code == 0, result.err
    out = " ".join(result.out.split())
    assert "* h1: holds" in out and "models (" in out and "own" in out
    assert "each once, linked by hard links;" in out  # a host allows them


def test_status_over_adb(kz, adb_device, artifacts, tmp_path):
    spec = f"adb:{adb_device.serial}:/data/local/tmp/kz-engine"
    for build in (artifacts.make("a1", blob_size=300_000), artifacts.make("a2", greeting="v2")):
        assert kz("deploy", "--device", spec, "--artifact", str(build)).code == 0
    model = write_model(tmp_path / "m.gguf", tensors=2)
    assert kz("models", "push", str(model), "--device", spec).code == 0
    local = status(kz, Path(adb_device.host_path("/data/local/tmp/kz-engine")))
    result = kz("device", "status", "--device", spec, "--json")
    assert result.code == 0, result.err
    over_adb = json.loads(result.out)
    assert {k: v for k, v in over_adb.items() if k not in ("device", "root")} == {
        k: v for k, v in local.items() if k not in ("device", "root")
    }
    assert over_adb["models"][0]["names"] == ["m.gguf"]
    assert over_adb["hard_links"] is False  # the test device holds Android's rule
    human = " ".join(kz("device", "status", "--device", spec).out.split())
    assert "linked by symlinks (the device refuses hard links)" in human


def test_a_cut_models_push_counts_its_file_once(kz, tmp_path):
    root = tmp_path / "device"
    work = root / "incoming" / ".kzm-3000-abc"
    work.mkdir(parents=True)
    (work / "in").write_bytes(b"x" * 3000)
    os.link(work / "in", work / "part")  # the checker's second name of the arriving file
    (work / "done").write_text("")
    assert status(kz, root)["incoming"] == 3000


@pytest.mark.parametrize("over", ["local", "adb"])
def test_keep_gives_up_model_pushes_cut_a_day_ago(kz, artifacts, tmp_path, request, over):
    if over == "adb":
        adb_device = request.getfixturevalue("adb_device")
        root = Path(adb_device.host_path("/data/local/tmp/kz-engine"))
        spec = f"adb:{adb_device.serial}:/data/local/tmp/kz-engine"
    else:
        root = tmp_path / "device"
        spec = f"local:{root}"
    build = artifacts.make("k1")
    assert kz("deploy", "--device", spec, "--artifact", str(build)).code == 0
    incoming = root / "incoming"
    old, fresh = incoming / ".kzm-100-aaaa", incoming / ".kzm-200-bbbb"
    for work in (old, fresh):
        work.mkdir()
        (work / "part").write_bytes(os.urandom(5000))
    day_ago = time.time() - 24 * 3600 - 120
    os.utime(old, (day_ago, day_ago))
    report = (
        status(kz, root)
        if over == "local"
        else json.loads(kz("device", "status", "--device", spec, "--json").out)
    )
    assert report["incoming"] >= 10_000
    assert kz("deploy", "--device", spec, "--artifact", str(build), "--keep", "1").code == 0
    assert not old.exists() and (fresh / "part").exists()
    second = artifacts.make("k2")
    assert kz("deploy", "--device", spec, "--artifact", str(second)).code == 0
    os.utime(fresh, (day_ago, day_ago))
    predicted = json.loads(kz("device", "status", "--device", spec, "--json").out)["keeps"][0]
    assert predicted["removes"] == ["k1"]
    before = stored_bytes(root) + 5000
    assert kz("deploy", "--device", spec, "--artifact", str(second), "--keep", "1").code == 0
    assert not fresh.exists()
    assert predicted["frees"] == before - stored_bytes(root)
