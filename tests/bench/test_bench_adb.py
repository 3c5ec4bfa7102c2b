"""run and bench over adb: the real adb client, a test device speaking the adb wire protocol.

The device shell is mksh with toybox (as on Android), so env values and arguments cross a
shell exactly as on a tablet; ``getprop`` answers with the test device's properties.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.adbdevice import AdbTestDevice
from tests.adbdevice.fs import DEFAULT_PROPS
from tests.bench.benchkit import (
    BUFFERS_TOOL,
    REPLAY_LLAMA_BENCH,
    SHOW_ARGS,
    TRICKY,
    DeviceRoot,
    env_options,
    make_device_root,
    stored_run_id,
    total_kib,
)

ROOT = "/data/local/tmp/kz-engine"


@pytest.fixture
def tablet(adb_device: AdbTestDevice) -> tuple[AdbTestDevice, DeviceRoot]:
    """The test device with a release deployed under ROOT (laid out on its filesystem)."""
    root = adb_device.host_path(ROOT)
    root.parent.mkdir(parents=True, exist_ok=True)
    release = make_device_root(
        root, build_id="b-adb", manifest={"build_id": "b-adb", "recipe": "pad3-v79"}
    )
    release.add_tool("show-args", SHOW_ARGS)
    release.add_tool("llama-bench", REPLAY_LLAMA_BENCH)
    release.add_file("models/q.gguf", b"model bytes")
    return adb_device, release


def test_run_over_adb_delivers_every_argument_and_env_value_unchanged(kz, tablet):
    device, release = tablet
    result = kz(
        "run",
        "--device",
        f"adb:{device.serial}:{ROOT}",
        *env_options(TRICKY),
        "--",
        "show-args",
        *TRICKY,
    )
    assert result.code == 0, result.err
    seen = json.loads(result.out)
    assert seen["argv"] == TRICKY
    assert [seen["env"][f"KZ_T_{n}"] for n in range(len(TRICKY))] == TRICKY
    assert not (release.root / "pwned").exists() and not list(release.root.rglob("pwned"))


def test_run_over_adb_returns_the_exit_code(kz, tablet):
    device, release = tablet
    release.add_tool("fails", "#!/bin/sh\necho bye >&2\nexit 7\n")
    result = kz("run", "--device", f"adb:{device.serial}:{ROOT}", "fails")
    assert result.code == 7
    assert "bye" in result.err


def test_bench_over_adb_records_the_android_fingerprint(kz, tablet):
    device, release = tablet
    result = kz(
        "bench",
        "--device",
        f"adb:{device.serial}:{ROOT}",
        "-m",
        "models/q.gguf",
        "-t",
        "4",
        "--env",
        "GGML_HEXAGON_OPFILTER=ADD|SUB",
        "--sweep",
        "env:GGML_HEXAGON_GDN_SELECT=1,2",
        "--json",
    )
    assert result.code == 0, result.err
    records = json.loads(result.out)["records"]
    assert len(records) == 4
    first = records[0]
    assert first["device"]["fingerprint"] == {
        "android.fingerprint": DEFAULT_PROPS["ro.build.fingerprint"],
        "android.soc_model": DEFAULT_PROPS["ro.soc.model"],
    }
    assert (
        first["build"]["build_id"] == "b-adb"
        and first["build"]["release_dir"] == f"{ROOT}/releases/b-adb"
    )
    tools = [f"{ROOT}/releases/b-adb/bin/kz-peakrss", f"{ROOT}/releases/b-adb/bin/llama-bench"]
    assert first["argv"][:2] == tools
    assert first["env"]["LD_LIBRARY_PATH"] == f"{ROOT}/releases/b-adb/lib"
    received = [
        json.loads(line) for line in (release.root / "received.jsonl").read_text().splitlines()
    ]
    assert sorted(call["env"]["GGML_HEXAGON_GDN_SELECT"] for call in received) == ["1", "2"]
    assert all(call["env"]["GGML_HEXAGON_OPFILTER"] == "ADD|SUB" for call in received)
    wanted = ["-o", "json", "-v", "-m", "models/q.gguf", "-t", "4"]
    assert all(call["argv"] == wanted for call in received)
    # measured under the device's mksh and toybox by kz-peakrss: the replaying python's peak
    # (well above 1 MiB, far below the machine's total); buffers from the replayed real log
    for item in records:
        assert 1024 < item["memory"]["peak_rss_kib"] < total_kib()
        buffers = item["memory"]["buffers"]
        assert ["CPU_REPACK", "model", 0.09] in buffers and ["CPU", "compute", 0.06] in buffers


def test_run_over_adb_stores_its_record_with_the_android_fingerprint_and_peak(kz, tablet):
    """kzbuild run's record on the adb device: kz-peakrss under mksh and toybox, the model hashed
    by toybox's sha256sum, getprop's fingerprint in the provenance."""
    device, release = tablet
    release.add_tool("llama-tool", BUFFERS_TOOL)
    ran = kz(
        "run",
        "--device",
        f"adb:{device.serial}:{ROOT}",
        "llama-tool",
        "-m",
        "models/q.gguf",
        "--mib",
        "32",
    )
    assert ran.code == 0, ran.err
    (record,) = json.loads(kz("results", "show", stored_run_id(ran.err), "--json").out)
    assert record["kind"] == "run" and 32 * 1024 < record["memory"]["peak_rss_kib"] < total_kib()
    assert ("CPU_REPACK", "model", 0.09) in [tuple(b) for b in record["memory"]["buffers"]]
    provenance = record["provenance"]
    assert provenance["device"]["android.fingerprint"] == DEFAULT_PROPS["ro.build.fingerprint"]
    assert provenance["model_sha256"] == hashlib.sha256(b"model bytes").hexdigest()
