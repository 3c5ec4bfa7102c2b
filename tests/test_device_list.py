"""kzbuild device list: each pool member with its holder and its state (free, busy, unreachable),
read from the real lock on each device: a local one, and the adb test device through a real adb
server."""

from __future__ import annotations

import json

from kzbuild.device.adb import AdbTransport
from kzbuild.device.devicelock import device_lock
from tests.adbdevice.server import free_port

ROOT = "/data/local/tmp/kz-engine"


def test_device_list_shows_each_pool_member_its_holder_and_its_state(
    kz, project, adb_device, tmp_path, monkeypatch
):
    stale, idle = tmp_path / "stale", tmp_path / "idle"
    (stale / ".lock").mkdir(parents=True)
    # a holder on this machine whose process is gone: free, its lock broken by the next operation
    (stale / ".lock" / "owner").write_text(
        "this-host\n4194303\n2026-12-04T07:00:00Z\ndeploy\nfedcba9876543210\n"
    )
    gone = f"127.0.0.1:{free_port()}"  # nothing listens there
    project.write(
        "recipes/devices.yaml",
        "devices:\n"
        f"  pad-a: {{transport: local, root: '{stale}'}}\n"
        f"  pad-b: {{transport: adb, serial: '{adb_device.serial}', root: {ROOT}}}\n"
        f"  pad-c: {{transport: adb, serial: '{gone}', root: {ROOT}}}\n"
        f"  spare: {{transport: local, root: '{idle}'}}\n"
        "pools:\n  pads: [pad-a, pad-b, pad-c]\n  two: [pad-a, spare]\n",
    )
    monkeypatch.setenv("KZ_LOCK_HOST", "this-host")
    transport = AdbTransport(adb_device.device(root=ROOT), connect_timeout=5)
    monkeypatch.setenv("KZ_LOCK_HOST", "bench-host-2")  # another machine's kzbuild takes pad-b
    with device_lock(transport, ROOT, "bench") as lock:
        monkeypatch.setenv("KZ_LOCK_HOST", "this-host")
        listed = kz("device", "list", "--json")
        text = kz("device", "list")
    transport.close()
    assert listed.code == 0, listed.err
    doc = json.loads(listed.out)
    assert doc["pools"] == {"pads": ["pad-a", "pad-b", "pad-c"], "two": ["pad-a", "spare"]}
    rows = {row["name"]: row for row in doc["devices"]}
    assert rows["pad-a"]["pools"] == ["pads", "two"] and rows["pad-a"]["state"] == "free"
    assert rows["pad-a"]["holder"] == "deploy by this-host pid 4194303 since 2026-12-04T07:00:00Z"
    assert rows["pad-a"]["detail"].startswith("stale lock of deploy by this-host")
    owner = lock.owner
    assert rows["pad-b"]["state"] == "busy" and rows["pad-b"]["pools"] == ["pads"]
    assert rows["pad-b"]["holder"] == f"bench by bench-host-2 pid {owner.pid} since {owner.since}"
    assert rows["pad-b"]["address"] == f"adb:{adb_device.serial}"
    assert rows["pad-c"]["state"] == "unreachable" and rows["pad-c"]["detail"]
    assert (rows["spare"]["state"], rows["spare"]["holder"], rows["spare"]["pools"]) == (
        "free",
        None,
        ["two"],
    )
    assert text.code == 0, text.err
    lines = {line.split()[0]: line for line in text.out.splitlines()}
    assert lines["pad-b"] == (
        f"pad-b [pool pads] adb:{adb_device.serial} busy: held by bench by bench-host-2 "
        f"pid {owner.pid} since {owner.since}"
    )
    assert lines["pad-a"].startswith(f"pad-a [pool pads, two] local:{stale} free: stale lock of")
    assert lines["pad-c"].startswith(f"pad-c [pool pads] adb:{gone} unreachable")
    assert lines["spare"] == f"spare [pool two] local:{idle} free"
    # released: free again, nobody holds it
    again = {r["name"]: r for r in json.loads(kz("device", "list", "--json").out)["devices"]}
    assert (again["pad-b"]["state"], again["pad-b"]["holder"]) == ("free", None)
