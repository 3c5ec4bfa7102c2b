"""Device commands on the adb server's socket: no adb client, the exit code from shell protocol v2,
and every way the stream can break (the real adb server and the adb test device)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kzbuild.adapters import proc
from kzbuild.device.adb import (
    PACKET_MAX,
    SHELL_HEADER,
    STDIN_PACKET,
    AdbTransport,
    ShellOutput,
    ShellPackets,
)
from kzbuild.errors import DeviceError
from kzbuild.model.device import Device
from tests.adbdevice import AdbTestDevice, PrivateAdbServer
from tests.adbdevice.fixtures import MakeDevice
from tests.adbdevice.process import DeviceProcess
from tests.adbdevice.server import free_port, port_open

REPO = Path(__file__).resolve().parents[2]


def packet(kind: int, data: bytes) -> bytes:
    return SHELL_HEADER.pack(kind, len(data)) + data


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every process kzbuild starts from here on (proc.run and proc.run_split)."""
    started: list[list[str]] = []
    real_run, real_split = proc.run, proc.run_split

    def run(argv: list[str], **options: object) -> proc.Result:
        started.append([str(arg) for arg in argv])
        return real_run(argv, **options)  # type: ignore[arg-type]

    def run_split(argv: list[str], **options: object) -> tuple[int, bytes, bytes]:
        started.append([str(arg) for arg in argv])
        return real_split(argv, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(proc, "run", run)
    monkeypatch.setattr(proc, "run_split", run_split)
    return started


# --- no adb client, and logged as one ---
def test_commands_and_state_checks_start_no_adb_client(
    transport: AdbTransport, clients: list[list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kzbuild.adapters.proc"):
        assert transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"]).returncode == 3
        assert transport.run_input(["cat"], [b"in"]).stdout == b"in"
        assert transport._state() == ("device", "")
    assert clients == []
    lines = [record.getMessage() for record in caplog.records]
    adb = shutil.which("adb")
    assert lines == [
        f"$ {adb} -s {transport.serial} shell -n -T -- 'set --; echo out; echo err >&2; exit 3'",
        f"$ {adb} -s {transport.serial} shell -T -- cat",
    ]


def test_a_tuple_argv_runs_its_script_inline(transport: AdbTransport) -> None:
    # sh -c SCRIPT NAME ARGS runs in adbd's own shell (set -- ARGS; SCRIPT), whose $0 is not NAME
    for argv in (
        ["sh", "-c", 'echo "$0|$1"', "kz", "a b"],
        ("sh", "-c", 'echo "$0|$1"', "kz", "a b"),
    ):
        name, _, arg = transport.run(argv).text().rstrip("\n").partition("|")
        assert (name != "kz", arg) == (True, "a b")


def test_the_server_socket_from_the_environment(
    adb_device: AdbTestDevice, clients: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = os.environ["ANDROID_ADB_SERVER_PORT"]
    AdbTransport(adb_device.device(), connect_timeout=5)  # adb connect: a client
    clients.clear()
    monkeypatch.setenv("ADB_SERVER_SOCKET", f"tcp:localhost:{port}")
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(free_port()))  # ADB_SERVER_SOCKET wins
    transport = AdbTransport(adb_device.device(), connect_timeout=5)
    assert transport.run(["echo", "ok"]).text() == "ok\n"
    assert clients == []
    monkeypatch.setenv("ADB_SERVER_SOCKET", "vsock:3:5037")
    with pytest.raises(DeviceError) as caught:
        AdbTransport(adb_device.device(), connect_timeout=5)
    assert str(caught.value) == (
        f"adb:{adb_device.serial}: ADB_SERVER_SOCKET=vsock:3:5037 is no socket kzbuild can reach"
    )


# --- stdin ---
def test_stdin_streams_in_packets_and_is_closed(
    transport: AdbTransport, adb_device: AdbTestDevice
) -> None:
    pieces = [os.urandom(3 * STDIN_PACKET + 17), b"", os.urandom(100), os.urandom(1 << 20)]
    remote = "/data/local/tmp/stdin.bin"
    result = transport.run_input(["sh", "-c", 'cat > "$1"; echo done', "kz", remote], pieces)
    assert (result.returncode, result.stdout) == (0, b"done\n")
    assert adb_device.host_path(remote).read_bytes() == b"".join(pieces)


def test_a_command_that_stops_reading_stdin_gives_its_exit_code(transport: AdbTransport) -> None:
    endless = (os.urandom(1 << 16) for _ in range(10_000))  # 655 MB: never all sent
    result = transport.run_input(["sh", "-c", "head -c 10 > /dev/null; exit 5"], endless)
    assert result.returncode == 5


def test_a_failing_input_cuts_the_command_before_it_ends(
    transport: AdbTransport, adb_device: AdbTestDevice
) -> None:
    def source() -> Iterator[bytes]:
        yield b"x" * 1000
        raise FileNotFoundError(2, "No such file or directory", "lib/libgone.so")

    with pytest.raises(FileNotFoundError, match="libgone.so"):
        transport.run_input(
            ["sh", "-c", "cat > /data/local/tmp/part; touch /data/local/tmp/finished"], source()
        )
    time.sleep(0.5)
    assert not adb_device.host_path("/data/local/tmp/finished").exists()


def test_a_command_without_stdin_reads_none(transport: AdbTransport) -> None:
    assert transport.run(["cat"], timeout=5).stdout == b""


# --- timeouts and sinks ---
def test_a_timeout_stops_the_command_on_the_device(
    transport: AdbTransport, adb_device: AdbTestDevice
) -> None:
    late = "/data/local/tmp/late"
    with pytest.raises(DeviceError) as caught:
        transport.run(["sh", "-c", f"sleep 1; touch {late}"], timeout=0.3)
    assert str(caught.value) == (
        f"adb:{adb_device.serial}: 'sh -c 'sleep 1; touch {late}'' timed out after 0.3 s; "
        "the command was stopped"
    )
    time.sleep(1.5)
    assert not adb_device.host_path(late).exists()
    assert transport.run(["true"]).ok  # the next command runs as before


def test_a_sink_that_fails_stops_the_command(transport: AdbTransport) -> None:
    def full(data: bytes) -> None:
        raise BrokenPipeError("the reader went away")

    with pytest.raises(BrokenPipeError):
        transport.run(["sh", "-c", "while true; do echo y; done"], on_stdout=full, timeout=20)


# --- the device or the server going away ---
def test_a_killed_device_mid_command_is_a_device_error(
    adb_env: PrivateAdbServer, tmp_path: Path
) -> None:
    device_process = DeviceProcess(tmp_path / "device", REPO)
    serial = device_process.serial
    try:
        device = Device(name="killed", transport="adb", serial=serial, root="/data/local/tmp/k")
        transport = AdbTransport(device, connect_timeout=5)
        threading.Timer(0.4, device_process.process.kill).start()  # SIGKILL: it says nothing
        with pytest.raises(DeviceError) as caught:
            transport.run(["sh", "-c", "echo started; sleep 5"])
        message = str(caught.value)
        assert message.startswith(f"adb:{serial}: ")
        assert message.endswith(("(while running sh)", "before the command finished")), message
        with pytest.raises(DeviceError, match=rf"adb:{serial}: (device offline|no such device)"):
            transport.run(["true"])
    finally:
        device_process.process.kill()
        device_process.process.wait()
        adb_env.adb("disconnect", serial)


def test_a_killed_adb_server_mid_command_is_a_device_error(
    adb_device: AdbTestDevice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = PrivateAdbServer(tmp_path / "server")
    server.start()
    try:
        monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(server.port))
        transport = AdbTransport(adb_device.device(), connect_timeout=5)
        assert server.process is not None
        threading.Timer(0.4, server.process.kill).start()
        with pytest.raises(DeviceError) as caught:
            transport.run(["sh", "-c", "echo started; sleep 5"])
        assert str(caught.value).startswith(
            f"adb:{adb_device.serial}: the adb server at localhost:{server.port} did not answer: "
        )
        assert caught.value.hint == "is it running? 'adb start-server' starts a local one"
    finally:
        server.stop()


def test_a_local_adb_server_not_running_is_started(
    make_adb_device: MakeDevice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(port))
    monkeypatch.setenv("HOME", str(tmp_path))  # its adb key stays out of the user's ~/.android
    device = make_adb_device()
    try:
        transport = AdbTransport(device.device(), connect_timeout=10)
        assert port_open(port)
        assert transport.run(["echo", "ok"]).text() == "ok\n"
    finally:
        adb = shutil.which("adb")
        assert adb is not None
        subprocess.run([adb, "-P", str(port), "kill-server"], capture_output=True, timeout=20)


def test_an_adb_server_on_another_machine_is_not_started(adb_env: PrivateAdbServer) -> None:
    port = free_port()
    device = Device(
        name="far", transport="adb", serial="R5CX1234", root="/x", server=f"127.0.0.1:{port}"
    )
    with pytest.raises(DeviceError) as caught:
        AdbTransport(device, connect_timeout=2)
    assert str(caught.value).startswith(
        f"adb:R5CX1234@127.0.0.1:{port}: the adb server at 127.0.0.1:{port} did not answer: "
    )
    assert caught.value.hint == (
        f"the adb server on 127.0.0.1:{port} serves this device: start it there"
    )
    assert not port_open(port)


def test_a_device_that_turns_unauthorized_is_named(
    transport: AdbTransport, adb_device: AdbTestDevice
) -> None:
    adb_device.mode = "unauthorized"
    adb_device.disconnect_all()  # the adb server reconnects, and the device asks for a key
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            transport.run(["true"])
        except DeviceError as exc:
            if "unauthorized" in str(exc):
                assert str(exc) == (
                    f"adb:{adb_device.serial}: device unauthorized (while running true)"
                )
                return
        time.sleep(0.1)
    pytest.fail("the device never showed as unauthorized")


def test_a_service_the_device_refuses_is_named(transport: AdbTransport) -> None:
    with pytest.raises(DeviceError) as caught:
        transport._open("frobnicate:now", "while testing")
    assert str(caught.value).startswith(
        f"adb:{transport.serial}: the device refused adb's 'frobnicate' service (while testing): "
    )


def test_a_command_longer_than_adb_carries_is_refused(transport: AdbTransport) -> None:
    with pytest.raises(DeviceError, match="a command of 70,0.. bytes is longer than adb carries"):
        transport.run(["echo", "x" * 70_000])


# --- the packet parser ---
PACKETS = st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=300)), max_size=12)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@given(packets=PACKETS, points=st.lists(st.integers(0, 10_000), max_size=8))
def test_packets_come_out_whole_however_the_stream_is_cut(
    packets: list[tuple[int, bytes]], points: list[int]
) -> None:
    stream = b"".join(packet(kind, data) for kind, data in packets)
    parser = ShellPackets()
    got = [item for piece in cut(stream, points) for item in parser.feed(piece)]
    assert got == packets and not parser.partial


@given(data=st.binary(max_size=400), points=st.lists(st.integers(0, 10_000), max_size=8))
def test_any_bytes_are_packets_a_partial_one_or_an_error(data: bytes, points: list[int]) -> None:
    parser = ShellPackets()
    got: list[tuple[int, bytes]] = []
    try:
        for piece in cut(data, points):
            got += parser.feed(piece)
    except ValueError as exc:
        assert "bytes" in str(exc)
        return
    whole = b"".join(packet(kind, body) for kind, body in got)
    assert data.startswith(whole)
    assert parser.partial == (len(data) > len(whole))


def test_a_packet_longer_than_any_adbd_sends_is_an_error() -> None:
    with pytest.raises(ValueError, match="a shell packet of 16,777,217 bytes"):
        ShellPackets().feed(SHELL_HEADER.pack(1, PACKET_MAX + 1))


@given(code=st.binary(max_size=4).filter(lambda b: len(b) != 1))
def test_an_exit_packet_holds_one_byte(code: bytes) -> None:
    with pytest.raises(ValueError, match="an exit packet of"):
        ShellOutput(None, None).take(3, code)
