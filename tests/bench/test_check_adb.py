"""kzbuild check and the quality corpus over adb: the real adb client, a test device whose shell is
mksh
with toybox (as on Android). The GDN patch's own Kz-Device-Test reaches the device's
test-backend-ops
with every argument as written; the corpus is pushed once and verified with toybox's sha256sum."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from kzbuild.device.registry import connect
from kzbuild.measure.quality import CORPORA, push_corpus
from tests.adbdevice import AdbTestDevice
from tests.bench.benchkit import DeviceRoot, make_device_root
from tests.conftest import REPO_ROOT, Project

ROOT = "/data/local/tmp/kz-engine"
# test-backend-ops as the device runs it: prints each op it was asked for, exits 1 unless -b names
# HTP0
BACKEND_OPS = """#!/bin/sh
echo "args: $*"
[ "$1" = "-o" ] && [ "$2" = "GATED_DELTA_NET" ] && [ "$3" = "-b" ] || exit 2
echo "  $2(type=f32,head_count=2): OK"
[ "$4" = "HTP0" ]
"""


@pytest.fixture
def tablet(adb_device: AdbTestDevice, project: Project) -> tuple[AdbTestDevice, DeviceRoot]:
    """The repo's recipes and patches in the project; a pad3-v79 release deployed on the test
    device."""
    for folder in ("recipes", "patches"):
        shutil.copytree(REPO_ROOT / folder, project.root / folder, dirs_exist_ok=True)
    root = adb_device.host_path(ROOT)
    root.parent.mkdir(parents=True, exist_ok=True)
    release = make_device_root(
        root, build_id="b-adb", manifest={"build_id": "b-adb", "recipe": "pad3-v79"}
    )
    release.add_tool("test-backend-ops", BACKEND_OPS)
    return adb_device, release


def test_check_runs_the_gdn_patchs_op_test_on_the_tablet(kz, tablet):
    device, release = tablet
    result = kz("check", "pad3-v79", "--device", f"adb:{device.serial}:{ROOT}", "--json")
    assert result.code == 0, result.err
    (found,) = json.loads(result.out)["results"]
    assert found["patch"] == "ggml-hexagon-accept-gated_delta_net-when-its-hvx-kernel-fits.patch"
    assert (
        found["command"] == "test-backend-ops -o GATED_DELTA_NET -b HTP0"
        and found["passed"] is True
    )
    assert found["argv"][0] == f"{ROOT}/releases/b-adb/bin/kz-peakrss"  # the run's peak memory too
    assert found["argv"][1:] == [
        f"{ROOT}/releases/b-adb/bin/test-backend-ops",
        "-o",
        "GATED_DELTA_NET",
        "-b",
        "HTP0",
    ]
    assert found["build"]["build_id"] == "b-adb" and found["device"]["fingerprint"]
    out = open(found["logs"] + ".stdout.log").read()
    assert (
        "args: -o GATED_DELTA_NET -b HTP0" in out
        and "GATED_DELTA_NET(type=f32,head_count=2): OK" in out
    )

    release.add_tool(
        "test-backend-ops", BACKEND_OPS.replace('"HTP0"', '"HTP1"')
    )  # the op fails on this device
    failed = kz("check", "pad3-v79", "--device", f"adb:{device.serial}:{ROOT}")
    assert failed.code == 17 and "FAILED (exit 1)" in failed.out


def test_the_corpus_is_pushed_once_and_checked_with_toybox(tablet):
    device, _ = tablet
    target = device.device()
    transport = connect(target)
    try:
        info, remote = push_corpus(transport, target, "fr-atelier")
        stored = device.host_path(remote)
        local = (CORPORA / "fr-atelier.txt").read_bytes()
        assert stored.read_bytes() == local and info.sha256 == hashlib.sha256(local).hexdigest()
        stored.write_bytes(b"damaged")  # toybox's sha256sum sees other bytes: sent again
        push_corpus(transport, target, "fr-atelier")
        assert stored.read_bytes() == local
    finally:
        transport.close()
