"""AdbTransport through a private adb server (its socket, and the real adb client for files) to
the test device."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.device.adb import AdbTransport
from kzbuild.device.registry import connect, parse_device_spec
from kzbuild.errors import DeviceError, NotAvailableHere
from kzbuild.model.device import Device
from tests.adbdevice import AdbTestDevice, PrivateAdbServer
from tests.adbdevice.device import Mode
from tests.adbdevice.fixtures import MakeDevice
from tests.adbdevice.server import free_port

HOSTILE = [
    "ADD|SUB",
    "$(x)",
    "`id`",
    "a'b",
    'a"b',
    'it\'s "quoted"',
    "line1\nline2",
    "  spaced  ",
    "",
    "*",
    "~",
    "; rm -rf /",
    "back\\slash",
    "-n",
    "--",
    "/data/local/tmp/kz-engine/x",
    "ünïcödé ✓",
]


def echo_args(transport: AdbTransport, args: list[str]) -> list[str]:
    """Run printf on the device and split what it printed back into arguments."""
    result = transport.run(["printf", "%s\\0", *args])
    assert result.returncode == 0, result.stderr
    return result.stdout.decode().split("\0")[:-1]


def test_exit_codes_come_back(transport: AdbTransport) -> None:
    assert transport.run(["true"]).returncode == 0
    assert transport.run(["false"]).returncode == 1
    assert transport.run(["sh", "-c", "exit 7"]).returncode == 7
    assert transport.run(["sh", "-c", "kill -9 $$"]).returncode == 137


def test_stdout_and_stderr_stay_separate(transport: AdbTransport) -> None:
    result = transport.run(["sh", "-c", "echo out; echo err >&2; echo out2"])
    assert (result.stdout, result.stderr) == (b"out\nout2\n", b"err\n")


def test_streaming_hands_output_to_callbacks(transport: AdbTransport) -> None:
    out: list[bytes] = []
    err: list[bytes] = []
    result = transport.run(
        ["sh", "-c", "echo one; echo two >&2; exit 3"], on_stdout=out.append, on_stderr=err.append
    )
    assert (b"".join(out), b"".join(err), result.returncode) == (b"one\n", b"two\n", 3)
    assert result.stdout == b"" and result.stderr == b""


def test_hostile_arguments_arrive_unchanged(transport: AdbTransport) -> None:
    assert echo_args(transport, HOSTILE) == HOSTILE


def test_env_and_cwd_are_quoted(transport: AdbTransport) -> None:
    transport.run(["mkdir", "-p", "/data/local/tmp/kz engine $(x)"])
    result = transport.run(
        ["sh", "-c", 'printf "%s|%s" "$PATTERN" "$(pwd)"'],
        cwd="/data/local/tmp/kz engine $(x)",
        env={"PATTERN": "ADD|SUB $(x) `y` 'z'"},
    )
    assert result.stdout.decode() == "ADD|SUB $(x) `y` 'z'|/data/local/tmp/kz engine $(x)"


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    args=st.lists(
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40
        ),
        min_size=1,
        max_size=4,
    )
)
def test_any_string_arrives_unchanged(transport: AdbTransport, args: list[str]) -> None:
    # NUL is the one character no argv can carry, on any system.
    assert echo_args(transport, args) == args
    # a device script (sh -c SCRIPT NAME ARGS) runs in adbd's own shell, as set -- ARGS; SCRIPT
    result = transport.run(["sh", "-c", 'printf "%s\\0" "$@"; exit 4', "kz", *args])
    assert result.returncode == 4, result.stderr
    assert result.stdout.decode().split("\0")[:-1] == args


def test_push_pull_round_trip_of_a_binary_file(
    transport: AdbTransport, adb_device: AdbTestDevice, tmp_path: Path
) -> None:
    blob = tmp_path / "blob.so"
    blob.write_bytes(bytes(range(256)) * 64 + os.urandom(300_000))
    blob.chmod(0o755)
    remote = "/data/local/tmp/kz-engine/releases/b1/lib/blob.so"
    transport.run(["mkdir", "-p", "/data/local/tmp/kz-engine/releases/b1/lib"])
    sent: list[int] = []
    transport.push(blob, remote, progress=sent.append)
    assert sent == [blob.stat().st_size]
    assert adb_device.host_path(remote).read_bytes() == blob.read_bytes()
    digest = transport.run(["sha256sum", remote]).text().split()
    assert digest == [hashlib.sha256(blob.read_bytes()).hexdigest(), remote]
    assert transport.run(["test", "-x", remote]).returncode == 0  # the mode travelled too
    back = tmp_path / "back.so"
    transport.pull(remote, back)
    assert back.read_bytes() == blob.read_bytes()


def test_large_push_reports_growing_progress(adb_device: AdbTestDevice, tmp_path: Path) -> None:
    transport = AdbTransport(adb_device.device(), connect_timeout=5, progress_interval=0.1)
    big = tmp_path / "model.gguf"
    big.write_bytes(os.urandom(5 << 20))
    adb_device.faults.send_delay = 0.02  # 80 chunks: about 1.6 s on the wire
    seen: list[int] = []
    transport.push(big, "/data/local/tmp/model.gguf", progress=seen.append)
    assert len(seen) >= 3 and seen == sorted(seen) and 0 < seen[0] < big.stat().st_size
    assert seen[-1] == big.stat().st_size
    assert adb_device.host_path("/data/local/tmp/model.gguf").read_bytes() == big.read_bytes()


def test_pull_of_a_missing_file_says_so(transport: AdbTransport, tmp_path: Path) -> None:
    with pytest.raises(DeviceError) as caught:
        transport.pull("/data/local/tmp/nothing-here", tmp_path / "x")
    assert "No such file or directory" in str(caught.value)
    assert str(caught.value).startswith(
        f"adb:{transport.serial}: pull /data/local/tmp/nothing-here"
    )


def test_push_into_a_missing_directory_is_created(
    transport: AdbTransport, adb_device: AdbTestDevice, tmp_path: Path
) -> None:
    # adb's fixed_push_mkdir feature: adbd makes the parents
    source = tmp_path / "f.txt"
    source.write_text("x")
    transport.push(source, "/data/local/tmp/new/dir/f.txt")
    assert adb_device.host_path("/data/local/tmp/new/dir/f.txt").read_text() == "x"


def test_push_failure_on_the_device_is_a_device_error(
    transport: AdbTransport, adb_device: AdbTestDevice, tmp_path: Path
) -> None:
    source = tmp_path / "f.txt"
    source.write_text("x")
    transport.run(["sh", "-c", "echo plain > /data/local/tmp/afile"])
    with pytest.raises(DeviceError) as caught:
        transport.push(source, "/data/local/tmp/afile/f.txt")
    assert str(caught.value).endswith(
        "/f.txt -> /data/local/tmp/afile/f.txt failed: stat failed when trying to push to "
        "/data/local/tmp/afile/f.txt: Not a directory"
    )


def test_drop_mid_push_raises_and_leaves_no_partial_file(
    adb_device: AdbTestDevice, tmp_path: Path
) -> None:
    transport = AdbTransport(adb_device.device(), connect_timeout=5)
    blob = tmp_path / "lib.so"
    blob.write_bytes(os.urandom(1 << 20))
    adb_device.drop_send_after(200_000)
    with pytest.raises(DeviceError) as caught:
        transport.push(blob, "/data/local/tmp/lib.so")
    message = str(caught.value)
    assert message.startswith(f"adb:{adb_device.serial}: ")
    assert (
        "device offline (while pushing lib.so)" in message or "couldn't read from device" in message
    )
    # the device removes the cut file when it sees the connection go, as adbd does: not
    # necessarily before the client has reported the failure
    partial = adb_device.host_path("/data/local/tmp/lib.so")
    deadline = time.monotonic() + 5
    while partial.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not partial.exists()
    # adb reconnects the device; a new transport waits for that and the push then succeeds
    again = AdbTransport(adb_device.device(), connect_timeout=10)
    again.push(blob, "/data/local/tmp/lib.so")
    assert adb_device.host_path("/data/local/tmp/lib.so").read_bytes() == blob.read_bytes()


def test_drop_mid_command_is_not_a_silent_success(
    transport: AdbTransport, adb_device: AdbTestDevice
) -> None:
    # adb 29's client exits 0 when the connection drops before the exit packet
    threading.Timer(0.3, adb_device.disconnect_all).start()
    with pytest.raises(DeviceError, match=r"device offline \(while running sh\)"):
        transport.run(["sh", "-c", "echo started; sleep 5"])


def test_getprop_answers_the_fingerprint(
    transport: AdbTransport, adb_device: AdbTestDevice
) -> None:
    assert transport.run(["getprop", "ro.soc.model"]).text() == "SM8750\n"
    adb_device.set_prop("ro.build.fingerprint", "vendor/pad3/pad3:15/X/1:user/release-keys")
    assert (
        transport.run(["getprop", "ro.build.fingerprint"]).text()
        == "vendor/pad3/pad3:15/X/1:user/release-keys\n"
    )
    assert transport.run(["getprop", "ro.nothing"]).text() == "\n"


def test_registry_connects_an_adhoc_adb_spec(adb_device: AdbTestDevice) -> None:
    device = parse_device_spec(f"adb:{adb_device.serial}:/data/local/tmp/elsewhere")
    assert device is not None and device.root == "/data/local/tmp/elsewhere"
    transport = connect(device, connect_timeout=5)
    assert transport.address == f"adb:{adb_device.serial}"
    assert transport.run(["uname"]).text() == "Linux\n"


def test_server_port_option_without_the_environment(
    adb_device: AdbTestDevice, adb_server: PrivateAdbServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANDROID_ADB_SERVER_PORT")
    transport = AdbTransport(adb_device.device(), server_port=adb_server.port, connect_timeout=5)
    assert transport.run(["echo", "ok"]).text() == "ok\n"


# --- errors ---
def test_nothing_listening_is_a_clear_error(adb_env: PrivateAdbServer) -> None:
    serial = f"127.0.0.1:{free_port()}"
    with pytest.raises(DeviceError) as caught:
        AdbTransport(
            Device(name="gone", transport="adb", serial=serial, root="/data/local/tmp/x"),
            connect_timeout=5,
        )
    assert (
        str(caught.value)
        == f"adb:{serial}: cannot connect: failed to connect to '{serial}': Connection refused"
    )


def test_unknown_usb_serial_lists_what_is_attached(adb_device: AdbTestDevice) -> None:
    AdbTransport(adb_device.device(), connect_timeout=5)  # so the server lists one device
    with pytest.raises(DeviceError) as caught:
        AdbTransport(
            Device(name="pad3", transport="adb", serial="R5CX1234", root="/data/local/tmp/x"),
            connect_timeout=5,
        )
    assert str(caught.value) == "adb:R5CX1234: no such device"
    assert (
        caught.value.hint is not None
        and f"adb devices lists: {adb_device.serial} device" in caught.value.hint
    )


@pytest.mark.parametrize(
    ("mode", "connect_timeout", "hint"),
    [("unauthorized", 5, "'Allow USB debugging?' prompt"), ("offline", 1, "adb reconnect")],
)
def test_unauthorized_and_offline_devices(
    make_adb_device: MakeDevice, mode: Mode, connect_timeout: float, hint: str
) -> None:
    device = make_adb_device(mode=mode)
    with pytest.raises(DeviceError) as caught:
        AdbTransport(device.device(), connect_timeout=connect_timeout)
    assert str(caught.value) == f"adb:{device.serial}: device {mode}"
    assert hint in (caught.value.hint or "")


def test_device_without_serial() -> None:
    with pytest.raises(DeviceError, match="adb device 'pad3' has no serial"):
        AdbTransport(Device(name="pad3", transport="adb", root="/data/local/tmp/x"))


def test_adb_missing_is_not_available_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NotAvailableHere, match="'adb' is not installed or not on PATH"):
        AdbTransport(
            Device(name="pad3", transport="adb", serial="R5CX1234", root="/data/local/tmp/x")
        )
