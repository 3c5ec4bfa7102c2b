"""``kzbuild doctor --device``: the device must answer, and doctor leaves no adb server behind."""

from __future__ import annotations

import json

import pytest

from tests.adbdevice.server import free_port, port_open
from tests.conftest import have

needs_adb = pytest.mark.skipif(not have("adb"), reason="needs the adb client")


def doctor_device(kz, spec: str) -> tuple[dict, str]:
    """doctor's device report (JSON) for ``spec``, and its stderr (the tests take ``tiny`` for its
    toolchains/)."""
    result = kz("doctor", "--target", "host", "--device", spec, "--json")
    assert result.code in (0, 6), result.err
    return json.loads(result.out)["device"], result.err


@needs_adb
def test_an_online_adb_device_is_ok_and_an_absent_one_is_not(tiny, kz, make_adb_device):
    """The test device holds Android's rule (no hard links for adb shell), which kzbuild's store
    does not need; doctor's probe of the device root leaves nothing behind."""
    device = make_adb_device()
    spec = f"adb:{device.serial}"
    report, err = doctor_device(kz, spec)
    assert report["ok"] is True, report
    assert report["detail"].startswith(f"{spec} online (adb server on port ")
    assert f"device {spec}" not in err
    assert list(device.fs.host_path("/data/local/tmp").iterdir()) == []

    device.stop()
    report, err = doctor_device(kz, spec)
    assert report["ok"] is False
    assert report["detail"].startswith(f"{spec}: ")  # adb's reason: offline, or cannot connect
    assert (
        f"not ready to build: host, device {spec}" in err
        or f"not ready to build: device {spec}" in err
    )


@needs_adb
def test_a_serial_nobody_serves_is_not_ok_with_what_adb_lists(tiny, kz, adb_env):
    report, err = doctor_device(kz, "adb:NOSUCHSERIAL")
    assert report == {
        "device": "adb:NOSUCHSERIAL",
        "transport": "adb",
        "ok": False,
        "detail": "adb:NOSUCHSERIAL: no such device",
        "hint": report["hint"],
    }
    assert report["hint"].startswith("adb devices lists: ")
    assert "device adb:NOSUCHSERIAL" in err


@needs_adb
def test_without_a_running_adb_server_doctor_starts_none_and_says_so(tiny, kz, monkeypatch):
    port = free_port()
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(port))
    report, _ = doctor_device(kz, "adb:SERIAL1")
    assert report["ok"] is False
    assert (
        report["detail"]
        == f"not checked: no adb server is running on port {port}, and doctor starts none"
    )
    assert "adb start-server" in report["hint"]
    assert not port_open(port)


def test_an_unreachable_ssh_device_is_not_ok_with_the_reason(tiny, kz):
    port = free_port()
    spec = f"ssh://me@127.0.0.1:{port}/data/kz"
    report, err = doctor_device(kz, spec)
    assert report["ok"] is False
    assert report["detail"].startswith(
        f"ssh://me@127.0.0.1:{port}: cannot connect to 127.0.0.1:{port}: "
    )
    assert f"device {spec}" in err


def test_an_ssh_device_is_ok_only_when_its_host_key_is_known(tiny, kz, sshd, ssh_home, tmp_path):
    spec = sshd.spec(tmp_path / "root")
    report, _ = doctor_device(kz, spec)
    assert report["ok"] is True, report
    assert report["detail"].endswith("logged in; its host key matches known_hosts")

    ssh_home.known_hosts.write_text("")
    report, _ = doctor_device(kz, spec)
    assert report["ok"] is False
    assert sshd.host_fingerprint in report["detail"]


@needs_adb
def test_a_device_root_without_symlinks_is_not_ok(tiny, kz, make_adb_device):
    """A root where symlinks are refused (a FUSE-backed /sdcard) cannot hold releases: doctor
    says so before a deploy fails on it."""
    device = make_adb_device(symlinks=False)
    spec = f"adb:{device.serial}"
    report, err = doctor_device(kz, spec)
    assert report["ok"] is False
    assert report["detail"].startswith(f"{spec} online (adb server on port ")
    assert report["detail"].endswith(
        "), but it does not allow symlinks there (/data/local/tmp/kz-engine): deploy needs "
        "symlinks and executable files"
    )
    assert "/data/local/tmp on Android (not /sdcard)" in report["hint"]
    assert f"device {spec}" in err
    assert list(device.fs.host_path("/data/local/tmp").iterdir()) == []  # the probe's files went
