"""The adb test device: a TCP listener that speaks the adb transport protocol like adbd.

It answers the host's CNXN with its own banner (mode ``device``), with AUTH challenges it
never accepts (mode ``unauthorized``), or not at all (mode ``offline``). Streams opened on
an online connection are served by :mod:`tests.adbdevice.services`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from kzbuild.model.device import DEFAULT_ROOT, Device
from tests.adbdevice import services
from tests.adbdevice.fs import DeviceFs
from tests.adbdevice.streams import Stream, StreamClosed
from tests.adbdevice.wire import (
    A_VERSION,
    AUTH,
    AUTH_SIGNATURE,
    AUTH_TOKEN,
    CLSE,
    CNXN,
    MAX_PAYLOAD,
    OKAY,
    OPEN,
    WRTE,
    Packet,
    ProtocolError,
    encode,
    read_packet,
)

Mode = Literal["device", "unauthorized", "offline"]
FEATURES = ("shell_v2", "stat_v2", "ls_v2", "fixed_push_mkdir")
Service = Callable[[Stream], None]


class Connection:
    """One TCP connection from the adb server."""

    def __init__(self, device: AdbTestDevice, sock: socket.socket) -> None:
        self.device = device
        self.sock = sock
        self.max_payload = MAX_PAYLOAD
        self.online = False
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self._streams: dict[int, Stream] = {}
        self._ids = itertools.count(1)
        self._dropped = threading.Event()

    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        with self._send_lock:
            self.sock.sendall(encode(command, arg0, arg1, data))

    def serve(self) -> None:
        try:
            while (packet := read_packet(self._reader)) is not None:
                self.dispatch(packet)
        except (OSError, ProtocolError):
            pass
        finally:
            self.drop()
            self._reader.close()

    def dispatch(self, packet: Packet) -> None:
        if packet.command == CNXN:
            self.on_connect(packet)
        elif packet.command == AUTH:
            self.on_auth(packet)
        elif not self.online:
            return  # adbd ignores everything else before the handshake
        elif packet.command == OPEN:
            self.on_open(packet)
        elif (stream := self._streams.get(packet.arg1)) is None:
            if packet.command == WRTE:
                self.send(CLSE, 0, packet.arg0)
        elif packet.command == WRTE:
            stream.deliver(packet.data)
            self.send(OKAY, stream.local_id, stream.remote_id)
        elif packet.command == OKAY:
            stream.acknowledged()
        elif packet.command == CLSE:
            self._streams.pop(stream.local_id, None)
            stream.peer_closed()

    def on_connect(self, packet: Packet) -> None:
        self.max_payload = min(MAX_PAYLOAD, packet.arg1)
        if self.device.mode == "device":
            self.online = True
            self.send(CNXN, A_VERSION, MAX_PAYLOAD, self.device.banner())
        elif self.device.mode == "unauthorized":
            self.send(AUTH, AUTH_TOKEN, 0, os.urandom(20))
        # offline: never answer, like an adbd that is wedged

    def on_auth(self, packet: Packet) -> None:
        # Unauthorized: every signature is refused with a new token; the public key the
        # host sends last waits for a user who never confirms the dialog.
        if self.device.mode == "unauthorized" and packet.arg0 == AUTH_SIGNATURE:
            self.send(AUTH, AUTH_TOKEN, 0, os.urandom(20))

    def on_open(self, packet: Packet) -> None:
        service = self.device.service_for(packet.data.rstrip(b"\0"))
        if service is None:
            self.send(CLSE, 0, packet.arg0)
            return
        stream = Stream(self, next(self._ids), packet.arg0)
        self._streams[stream.local_id] = stream
        self.send(OKAY, stream.local_id, stream.remote_id)
        threading.Thread(target=self.run_service, args=(service, stream), daemon=True).start()

    def run_service(self, service: Service, stream: Stream) -> None:
        try:
            service(stream)
        except (StreamClosed, OSError):
            pass
        finally:
            stream.close()

    def close_stream(self, stream: Stream) -> None:
        self._streams.pop(stream.local_id, None)
        try:
            self.send(CLSE, stream.local_id, stream.remote_id)
        except OSError:
            pass

    def drop(self) -> None:
        """End the TCP connection at once (also the mid-transfer fault)."""
        if self._dropped.is_set():
            return
        self._dropped.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for stream in list(self._streams.values()):
            stream.peer_closed()
        self._streams.clear()
        self.device.forget(self)


class AdbTestDevice:
    """A device on ``127.0.0.1:<port>``; its filesystem lives under ``base/fs``."""

    def __init__(
        self,
        base: Path,
        *,
        mode: Mode = "device",
        props: Mapping[str, str] | None = None,
        selinux: bool = True,
        symlinks: bool = True,
    ) -> None:
        """``selinux``: its shell may not hard-link, as Android's policy says for adb shell;
        ``symlinks=False``: nor make symlinks (as on a FUSE-backed /sdcard)."""
        self.fs = DeviceFs(base, props, selinux=selinux, symlinks=symlinks)
        self.mode: Mode = mode
        self.faults = services.Faults()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._connections: set[Connection] = set()
        self._lock = threading.Lock()
        self._accepting = threading.Thread(
            target=self._accept, daemon=True, name=f"adbdevice:{self.port}"
        )
        self._accepting.start()

    @property
    def serial(self) -> str:
        return f"127.0.0.1:{self.port}"

    def banner(self) -> bytes:
        props = ";".join(
            f"{key}={self.fs.props[key]}"
            for key in ("ro.product.name", "ro.product.model", "ro.product.device")
        )
        return f"device::{props};features={','.join(FEATURES)}".encode()

    def service_for(self, name: bytes) -> Service | None:
        kind, _, command = name.partition(b":")
        if kind == b"sync" and not command:
            return lambda stream: services.sync(stream, self.fs, self.faults)
        if kind == b"exec":
            return lambda stream: services.shell_raw(stream, self.fs, command)
        if kind == b"shell" or kind.startswith(b"shell,"):
            options = kind.split(b",")[
                1:
            ]  # v2, raw/pty, TERM=...; without a pty raw and pty are alike
            if b"v2" in options:
                return lambda stream: services.shell_v2(stream, self.fs, command, self.faults)
            return lambda stream: services.shell_raw(stream, self.fs, command)
        return None

    # --- what tests use ---
    def host_path(self, device_path: str) -> Path:
        return self.fs.host_path(device_path)

    def device(self, name: str = "testpad", root: str = DEFAULT_ROOT, **fields: object) -> Device:
        """A kzbuild Device for this test device (adb transport, serial 127.0.0.1:PORT)."""
        return Device(name=name, transport="adb", serial=self.serial, root=root, **fields)  # type: ignore[arg-type]

    def set_prop(self, name: str, value: str) -> None:
        self.fs.props[name] = value
        self.fs.write_props()

    def drop_send_after(self, nbytes: int) -> None:
        self.faults.drop_send_after(nbytes)

    def disconnect_all(self) -> None:
        """Drop every connection, as if the cable were pulled (the adb server reconnects)."""
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.drop()

    def stop(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        except OSError:
            pass
        self._listener.close()
        self.disconnect_all()
        self._accepting.join(timeout=5)
        for child in self.fs.started:  # what outlived its hang-up (it ignores SIGHUP)
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)

    # --- internals ---
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = Connection(self, sock)
            with self._lock:
                self._connections.add(connection)
            threading.Thread(
                target=connection.serve, daemon=True, name=f"adbdevice:{self.port}:conn"
            ).start()

    def forget(self, connection: Connection) -> None:
        with self._lock:
            self._connections.discard(connection)
