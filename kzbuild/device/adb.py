"""The adb transport: commands and bulk copies on the adb server's socket, single files through
the real ``adb`` client.

The adb server port comes from ``server_port`` or, as adb itself does, from
``ANDROID_ADB_SERVER_PORT`` in the environment (default 5037); ``ADB_SERVER_SOCKET`` (``tcp:``,
``localabstract:``, ``localfilesystem:``) names it too, and a device's ``server: HOST:PORT`` is
another machine's.

A device command is what ``adb -s SERIAL shell -T -- CMD`` asks the server for, without starting
an adb client (3-4.5 ms of CPU each): on the server's socket, ``host:transport:SERIAL``, then the
device's ``shell,v2,raw:CMD`` service (each request 4 hex digits of length and the text; the
server answers OKAY, or FAIL and its words), then shell protocol v2 on the same stream: packets
of a 1-byte id, a 4-byte little-endian length and the data (stdin 0, stdout 1, stderr 2, the exit
code 3, stdin closed 4). CMD is built by :func:`~kzbuild.device.base.remote_command`, so every
argument is shell-quoted once and arrives unchanged; a device script (``sh -c SCRIPT NAME
ARGS...``) runs in the shell adbd starts (``set -- ARGS...; SCRIPT``: the same parse, one shell
process less on the device). A stream that ends before the exit code's packet is a command that
did not finish: the transport then asks the server whether the device is still online, and
raises DeviceError either way, never a silent success. Each command is logged as the adb client
command it stands for (:func:`kzbuild.adapters.proc.log_call`).

A bulk copy (:meth:`AdbTransport.push_files`, deploy's contents) speaks adb's sync protocol on the
same socket (the ``sync:`` service, what ``adb push`` speaks): per file ``SEND`` with
"PATH,MODE", its bytes in ``DATA`` messages of 64 KiB at most, ``DONE`` with the mtime; the
device answers each file with ``OKAY``, or ``FAIL`` and its words (and removes the file it was
writing). Files go one after the other without waiting for the answers, which are read as they
come, and the files' bytes go straight from the artifact: no staging dir, no adb client.
``QUIT`` rides in the last write: sent after the answers, it left the tail of the transfer to
wait out a delayed TCP ACK (40 ms) between an adb server and a device on TCP. Single files
(``adb push``, ``adb pull``) go through the client (:mod:`kzbuild.adapters.proc`).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import select
import shlex
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from kzbuild.adapters import proc
from kzbuild.device.base import (
    NO_SPACE,
    PUSH_MODE_BITS,
    ByteSink,
    ByteSource,
    Member,
    ProgressFn,
    RemoteResult,
    StoredFn,
    device_full,
    remote_command,
)
from kzbuild.errors import CommandFailed, DeviceError
from kzbuild.model.device import Device

NETWORK_SERIAL = re.compile(
    r"^(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9.-]+):\d+$"
)  # host:port, adb connect-able
PROGRESS_POLL_MIN = 4 << 20  # smaller pushes report progress once, when done
UNAUTHORIZED_HINT = (
    "unlock the device and accept its 'Allow USB debugging?' prompt for this computer, then retry"
)
OFFLINE_HINT = (
    "the device is attached but not answering: replug it, or run 'adb reconnect' / restart adbd"
)
DEFAULT_SERVER_PORT = 5037
SHELL_STDIN, SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT, SHELL_CLOSE_STDIN = range(5)
SHELL_HEADER = struct.Struct("<BI")  # a shell protocol v2 packet: id, length of the data
STDIN_PACKET = 32 << 10  # data per stdin packet
PACKET_MAX = 16 << 20  # adbd sends at most its buffer (1 MiB) per packet: more is a broken stream
REQUEST_MAX = 0xFFFF  # a request's length is 4 hex digits
SOCKET_SPECS = ("tcp:", "localabstract:", "localfilesystem:")  # of ADB_SERVER_SOCKET
SYNC_HEADER = struct.Struct("<4sI")  # a sync message: its id, then a length (or an mtime)
SYNC_DATA = (64 << 10) - SYNC_HEADER.size  # a DATA message of 64 KiB in all, as adb's client
SYNC_WRITE = 1 << 20  # messages are joined into writes of about this many bytes
SYNC_PATH_MAX = 1024  # adbd refuses a longer path
SYNC_FAIL_MAX = 64 << 10  # a FAIL's words; more is a broken stream
REGULAR_FILE = 0o100000  # S_IFREG: the mode of SEND names a regular file
Address = tuple[str, int] | str  # the adb server's: (host, port), or a unix socket's path


class AdbTransport:
    """One device through the adb server; opening it connects and checks it is online.

    Options (``registry.connect(device, **options)``): ``server_port`` (else the adb
    default: ANDROID_ADB_SERVER_PORT, else 5037); ``connect_timeout`` for ``adb connect``,
    for waiting out an ``offline`` state, for reaching the adb server and the device's shell
    service, and for each state query; ``transfer_timeout`` for each push and pull (None: no
    limit); ``progress_interval`` between size polls of a push of 4 MiB or more. A local adb
    server that is not running is started (``adb start-server``) when the transport opens.
    """

    def __init__(
        self,
        device: Device,
        *,
        server_port: int | None = None,
        connect_timeout: float = 10.0,
        transfer_timeout: float | None = None,
        progress_interval: float = 0.5,
    ) -> None:
        if not device.serial:
            raise DeviceError(
                f"adb device '{device.name}' has no serial", hint="set serial: in the devices file"
            )
        self.serial = device.serial
        self.device = device
        self.connect_timeout = connect_timeout
        self.transfer_timeout = transfer_timeout
        self.progress_interval = progress_interval
        adb = proc.require(
            "adb", why="the adb transport drives the adb client; Debian package 'adb'"
        )
        self._adb = [adb, *server_options(device.server, server_port)]
        server = server_address(device.server, server_port, os.environ)
        if server is None:
            spec = os.environ.get("ADB_SERVER_SOCKET", "")
            raise DeviceError(
                f"{self.address}: ADB_SERVER_SOCKET={spec} is no socket kzbuild can reach",
                hint=f"name the adb server as one of {', '.join(SOCKET_SPECS)}",
            )
        self._server: Address = server
        self._may_start = device.server is None  # a local server, while the transport opens
        self._wait_online()
        self._may_start = False

    @property
    def address(self) -> str:
        return self.device.address

    # --- Transport ---
    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: ByteSink | None = None,
        on_stderr: ByteSink | None = None,
    ) -> RemoteResult:
        return self._shell(argv, shell_line(argv, cwd, env), None, timeout, on_stdout, on_stderr)

    def run_input(
        self, argv: Sequence[str], data: ByteSource, *, timeout: float | None = None
    ) -> RemoteResult:
        """The shell protocol v2 carries ``data`` as stdin packets, then closes stdin."""
        return self._shell(argv, shell_line(argv, None, None), data, timeout, None, None)

    def _shell(
        self,
        argv: Sequence[str],
        command: str,
        stdin: ByteSource | None,
        timeout: float | None,
        on_stdout: ByteSink | None,
        on_stderr: ByteSink | None,
    ) -> RemoteResult:
        """``command`` in the device's shell (shell protocol v2 on the adb server's socket)."""
        what = f"'{shlex.join(argv)}'"
        proc.log_call(
            self._device_argv("shell", *(() if stdin is not None else ("-n",)), "-T", "--", command)
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        sock = self._open(f"shell,v2,raw:{command}", f"while running {argv[0]}")
        feeder = None
        failures: list[Exception] = []
        output = ShellOutput(on_stdout, on_stderr)
        broken = None
        try:
            if stdin is None:
                with contextlib.suppress(OSError):  # a cut stream shows as no exit code
                    sock.sendall(SHELL_HEADER.pack(SHELL_CLOSE_STDIN, 0))
            else:
                feeder = threading.Thread(
                    target=feed_stdin, args=(sock, stdin, failures), daemon=True
                )
                feeder.start()
            code = read_shell(sock, output, deadline)
        except ValueError as exc:  # a stream that is no shell protocol v2
            code, broken = None, exc
        finally:
            if feeder is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # a feeder blocked on a full stream ends
                feeder.join()
            sock.close()
        if failures:
            raise failures[0]  # reading the input failed (a local file vanished)
        if broken is not None:
            raise DeviceError(f"{self.address}: {what}: the adb server sent {broken}") from broken
        if code is None and deadline is not None and time.monotonic() >= deadline:
            raise DeviceError(
                f"{self.address}: {what} timed out after {timeout} s; the command was stopped"
            )
        if code is None:
            self._check_online(f"while running {argv[0]}")
            raise DeviceError(
                f"{self.address}: {what} ended without its exit code: the connection to the "
                "device was cut before the command finished"
            )
        return RemoteResult(code, bytes(output.out), bytes(output.err))

    def push(self, local: Path, remote: str, *, progress: ProgressFn | None = None) -> None:
        size = local.stat().st_size
        done = threading.Event()
        poller = None
        if progress and size >= PROGRESS_POLL_MIN:
            poller = threading.Thread(
                target=self._poll_size, args=(remote, progress, done), daemon=True
            )
            poller.start()
        try:
            result = self._transfer("push", str(local), remote)
        finally:
            done.set()
            if poller:
                poller.join()
        if not result.ok:
            self._check_online(f"while pushing {local.name}")
            raise DeviceError(
                f"{self.address}: push {local} -> {remote} failed: {adb_error(result)}"
            )
        if progress:
            progress(size)

    def push_files(
        self, files: Sequence[Member], remote: str, *, on_stored: StoredFn | None = None
    ) -> None:
        """The sync protocol on the adb server's socket (see the module's doc); ``transfer_timeout``
        bounds the whole copy."""
        proc.log_call(self._device_argv("push", f"<{len(files)} files>", remote))
        if not files:
            return
        limit = self.transfer_timeout
        deadline = None if limit is None else time.monotonic() + limit
        sock = self._open("sync:", f"while pushing to {remote}")
        push = SyncPush(sock, files, on_stored)
        try:
            push.send(remote, deadline)
        except SyncFailed as exc:
            if NO_SPACE in exc.words:
                raise device_full(self.address, f"writing {remote}/ failed: {exc.words}") from exc
            raise DeviceError(f"{self.address}: push to {remote}/ failed: {exc.words}") from exc
        except TimeoutError as exc:
            raise DeviceError(
                f"{self.address}: push to {remote}/ timed out after {self.transfer_timeout} s "
                f"with {push.stored} of {len(files)} file(s) stored; it was stopped"
            ) from exc
        except (OSError, SyncBroken) as exc:
            self._check_online(
                f"while pushing to {remote}, {push.stored} of {len(files)} file(s) stored"
            )
            raise DeviceError(
                f"{self.address}: push to {remote}/ was cut after {push.stored} of {len(files)} "
                f"file(s): {exc}"
            ) from exc
        finally:
            sock.close()

    def pull(self, remote: str, local: Path) -> None:
        result = self._transfer("pull", remote, str(local))
        if not result.ok:
            self._check_online(f"while pulling {remote}")
            raise DeviceError(
                f"{self.address}: pull {remote} -> {local} failed: {adb_error(result)}"
            )

    def close(self) -> None:
        pass  # the adb server keeps the connection; nothing is held here

    # --- internals ---
    def _device_argv(self, *args: str) -> list[str]:
        return [*self._adb, "-s", self.serial, *args]

    def _transfer(self, *args: str) -> proc.Result:
        try:
            return proc.run(self._device_argv(*args), check=False, timeout=self.transfer_timeout)
        except CommandFailed as exc:
            raise DeviceError(
                f"{self.address}: adb {args[0]} {exc.stderr}; the adb client was stopped"
            ) from exc

    def _poll_size(self, remote: str, progress: ProgressFn, done: threading.Event) -> None:
        """Report the growing size of the file on the device: adb prints no progress to a pipe."""
        stat = ["stat", "-c", "%s", remote]
        reported = 0
        while not done.wait(self.progress_interval):
            try:
                result = self.run(stat, timeout=self.connect_timeout)
            except DeviceError:
                continue
            text = result.text().strip()
            if result.ok and text.isdigit() and int(text) > reported and not done.is_set():
                reported = int(text)
                progress(reported)

    def _state(self) -> tuple[str, str]:
        """The adb server's view of the device:
        (device|offline|unauthorized|connecting|missing|other, adb's words).

        Asked on the adb server's own socket (what ``adb get-state`` sends it)."""
        with self._server_socket() as sock:
            try:
                words = request(sock, f"host-serial:{self.serial}:get-state")
                if words is None:
                    return read_string(sock).strip(), ""
            except (OSError, ValueError) as exc:
                raise self._server_gone(exc) from exc
        return state_of(words), words.strip()

    def _open(self, service: str, during: str) -> socket.socket:
        """A stream to the device's ``service``, through the adb server: ``host:transport``
        chooses the device, then the server opens the service on it."""
        if len(service.encode()) > REQUEST_MAX:
            raise DeviceError(
                f"{self.address}: a command of {len(service.encode()):,} bytes is longer than "
                f"adb carries ({REQUEST_MAX:,})"
            )
        sock = self._server_socket()
        try:
            refused = request(sock, f"host:transport:{self.serial}")
            if refused is not None:
                self._raise_state(state_of(refused), refused.strip(), f" ({during})")
            refused = request(sock, service)
            if refused is not None:
                raise DeviceError(
                    f"{self.address}: the device refused adb's '{service.partition(':')[0]}' "
                    f"service ({during}): {refused.strip()}",
                    hint="kzbuild needs shell protocol v2 (Android 7 or newer)",
                )
            sock.settimeout(None)  # the command's own timeout is its deadline
            return sock
        except (OSError, ValueError) as exc:
            sock.close()
            raise self._server_gone(exc) from exc
        except DeviceError:
            sock.close()
            raise

    def _server_socket(self) -> socket.socket:
        """A new connection to the adb server (started first if it is local and not running,
        once per transport)."""
        try:
            return connect_server(self._server, self.connect_timeout)
        except OSError as exc:
            if self._may_start and isinstance(exc, ConnectionRefusedError | FileNotFoundError):
                self._may_start = False
                with contextlib.suppress(CommandFailed):  # timed out: the retry says it
                    proc.run(
                        [*self._adb, "start-server"], check=False, timeout=self.connect_timeout
                    )
                return self._server_socket()
            raise self._server_gone(exc) from exc

    def _server_gone(self, exc: Exception) -> DeviceError:
        return DeviceError(
            f"{self.address}: the adb server at {address_text(self._server)} did not answer: {exc}",
            hint="is it running? 'adb start-server' starts a local one"
            if self.device.server is None
            else f"the adb server on {self.device.server} serves this device: start it there",
        )

    def _wait_online(self) -> None:
        """Connect a host:port serial if the server doesn't know it; wait out a transient
        offline."""
        deadline = time.monotonic() + self.connect_timeout
        connect_words: str | None = None
        while True:
            state, text = self._state()
            if state == "device":
                return
            if state == "missing" and connect_words is None and NETWORK_SERIAL.match(self.serial):
                connect_words = self._connect(deadline)
                continue
            if state in ("offline", "connecting") and time.monotonic() < deadline:
                time.sleep(
                    0.1
                )  # the handshake is under way, or adb is reconnecting a dropped device
                continue
            if state == "missing" and connect_words:
                raise DeviceError(
                    f"{self.address}: cannot connect: {connect_words}",
                    hint="is adbd listening there (adb tcpip PORT)?",
                )
            self._raise_state(state, text, "")

    def _connect(self, deadline: float) -> str:
        """``adb connect``'s words (it exits 0 even when it fails); '' if it outlived the
        deadline."""
        try:
            result = proc.run(
                [*self._adb, "connect", self.serial],
                check=False,
                timeout=max(deadline - time.monotonic(), 0.1),
            )
        except CommandFailed:
            return ""  # adb was still waiting for the device's handshake: the state says the rest
        return (result.stdout + result.stderr).strip()

    def _check_online(self, during: str) -> None:
        state, text = self._state()
        if state != "device":
            self._raise_state(state, text, f" ({during})")

    def _raise_state(self, state: str, text: str, during: str) -> None:
        if state == "unauthorized":
            raise DeviceError(
                f"{self.address}: device unauthorized{during}", hint=UNAUTHORIZED_HINT
            )
        if state in ("offline", "connecting"):
            raise DeviceError(f"{self.address}: device offline{during}", hint=OFFLINE_HINT)
        if state == "missing":
            raise DeviceError(f"{self.address}: no such device{during}", hint=self._attached_hint())
        detail = f": {text}" if text else ""
        raise DeviceError(f"{self.address}: device is in state '{state}'{during}{detail}")

    def _attached_hint(self) -> str:
        result = proc.run([*self._adb, "devices"], check=False, timeout=self.connect_timeout)
        lines = result.stdout.splitlines()[1:] if result.ok else []
        attached = [" ".join(line.split()) for line in lines if line.strip()]
        listed = "; ".join(attached) if attached else "nothing"
        return f"adb devices lists: {listed}; a network device needs SERIAL as host:port"


def server_options(server: str | None, port: int | None) -> list[str]:
    """adb's options for the server a device is served by: another machine's (``-H HOST -P PORT``),
    or this machine's on ``port`` (else adb's default: ANDROID_ADB_SERVER_PORT, else 5037)."""
    if server:
        host, _, server_port = server.rpartition(":")
        return ["-H", host.strip("[]"), "-P", server_port]
    return ["-P", str(port)] if port else []


def server_address(
    server: str | None, port: int | None, environ: Mapping[str, str]
) -> Address | None:
    """Where the adb client would reach its server (see :func:`server_options`; else
    ADB_SERVER_SOCKET, else ANDROID_ADB_SERVER_PORT); None for an ADB_SERVER_SOCKET that is none
    of :data:`SOCKET_SPECS`."""
    if server:
        host, _, server_port = server.rpartition(":")
        return host.strip("[]"), int(server_port)
    spec = environ.get("ADB_SERVER_SOCKET", "") if not port else ""
    if not spec:
        return "localhost", port or adb_server_port(environ)
    kind, _, rest = spec.partition(":")
    if kind == "tcp":
        host, _, text = rest.rpartition(":")
        return (host.strip("[]") or "localhost", int(text)) if text.isdigit() else None
    if kind == "localabstract" and rest:
        return "\0" + rest
    if kind == "localfilesystem" and rest:
        return rest
    return None


def address_text(address: Address) -> str:
    if isinstance(address, str):
        return "@" + address[1:] if address.startswith("\0") else address
    return f"{address[0]}:{address[1]}"


def connect_server(address: Address, timeout: float) -> socket.socket:
    """A connection to the adb server at ``address``, with ``timeout`` for each call on it."""
    if not isinstance(address, str):
        sock = socket.create_connection(address, timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    return sock


def request(sock: socket.socket, text: str) -> str | None:
    """Send one request to the adb server (4 hex digits of length, the text): None when it
    answers OKAY, its words when it answers FAIL. ValueError for anything else."""
    data = text.encode()
    sock.sendall(b"%04x%s" % (len(data), data))
    status = read_exact(sock, 4)
    if status == b"OKAY":
        return None
    if status == b"FAIL":
        return read_string(sock)
    raise ValueError(f"{status!r} where OKAY or FAIL belongs")


def read_string(sock: socket.socket) -> str:
    """A length-prefixed answer of the adb server (4 hex digits, the text)."""
    length = read_exact(sock, 4)
    try:
        size = int(length, 16)
    except ValueError:
        raise ValueError(f"{length!r} where a length belongs") from None
    return read_exact(sock, size).decode(errors="replace")


def read_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        piece = sock.recv(size - len(data))
        if not piece:
            raise ConnectionError("the adb server closed the connection")
        data += piece
    return bytes(data)


def state_of(words: str) -> str:
    """The device state named by the adb server's words for a device it cannot serve."""
    for state, marker in (
        ("unauthorized", "unauthorized"),
        ("offline", "offline"),
        ("connecting", "still connecting"),
        ("connecting", "still authorizing"),
        ("missing", "not found"),
        ("missing", "no devices"),
    ):
        if marker in words:
            return state
    return "other"


def shell_line(argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None) -> str:
    """The command line for adbd's shell; a device script (``sh -c SCRIPT NAME ARGS...``) runs in
    that shell itself, as ``set -- ARGS...; SCRIPT``."""
    if len(argv) >= 3 and tuple(argv[:2]) == ("sh", "-c") and cwd is None and not env:
        return f"{remote_command(['set', '--', *argv[4:]])}; {argv[2]}"
    return remote_command(argv, cwd=cwd, env=env)


class ShellPackets:
    """Shell protocol v2 packets, ``(id, data)``, out of the pieces a stream arrives in.

    :meth:`feed` raises ValueError for a packet longer than :data:`PACKET_MAX`; ``partial``
    says whether the stream so far ends inside a packet."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def partial(self) -> bool:
        return bool(self._buffer)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buffer = self._buffer
        buffer += data
        packets: list[tuple[int, bytes]] = []
        start = 0
        while len(buffer) - start >= SHELL_HEADER.size:
            kind, length = SHELL_HEADER.unpack_from(buffer, start)
            if length > PACKET_MAX:
                raise ValueError(f"a shell packet of {length:,} bytes")
            end = start + SHELL_HEADER.size + length
            if end > len(buffer):
                break
            packets.append((kind, bytes(buffer[start + SHELL_HEADER.size : end])))
            start = end
        del buffer[:start]
        return packets


class ShellOutput:
    """What a device command sent: stdout and stderr, each to its sink or kept, and its exit code
    (None until the exit packet came). Packets of other ids mean nothing to a command without
    a terminal and are left alone."""

    def __init__(self, on_stdout: ByteSink | None, on_stderr: ByteSink | None) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.code: int | None = None
        self._sinks = {SHELL_STDOUT: on_stdout or self.out.extend}
        self._sinks[SHELL_STDERR] = on_stderr or self.err.extend

    def take(self, kind: int, data: bytes) -> None:
        if kind == SHELL_EXIT:
            if len(data) != 1:
                raise ValueError(f"an exit packet of {len(data)} bytes")
            self.code = data[0]
        elif kind in self._sinks and data:
            self._sinks[kind](data)


def read_shell(sock: socket.socket, output: ShellOutput, deadline: float | None) -> int | None:
    """Read a command's packets into ``output`` until its exit code (returned); None when the
    stream ends first or the ``deadline`` (a monotonic time) passes."""
    packets = ShellPackets()
    ready = select.poll()  # not select(): it takes no descriptor above 1023
    ready.register(sock, select.POLLIN)
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not ready.poll(max(left * 1000, 1)):
                return None
        try:
            data = sock.recv(1 << 16)
        except OSError:
            return None  # the connection was reset: as if it ended
        if not data:
            if packets.partial:
                raise ValueError("a shell packet cut short")
            return None
        for kind, body in packets.feed(data):
            output.take(kind, body)
            if output.code is not None:
                return output.code


def feed_stdin(sock: socket.socket, data: ByteSource, failures: list[Exception]) -> None:
    """Send ``data`` as stdin packets, then close the command's stdin. A stream that takes no more
    (the command ended) stops it quietly; a source that fails goes into ``failures`` and cuts the
    stream, so the command does not run on part of its input."""
    pieces = iter(data)
    while True:
        try:
            piece = next(pieces, None)
        except Exception as exc:
            failures.append(exc)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            return
        try:
            if piece is None:
                sock.sendall(SHELL_HEADER.pack(SHELL_CLOSE_STDIN, 0))
                return
            view = memoryview(piece)
            for start in range(0, len(view), STDIN_PACKET):
                part = view[start : start + STDIN_PACKET]
                sock.sendall(SHELL_HEADER.pack(SHELL_STDIN, len(part)) + part)
        except OSError:
            return  # the device ended the stream: its exit code (or its absence) says why


class SyncFailed(Exception):
    """The device answered a file of a sync push with FAIL; ``words`` are its."""

    def __init__(self, words: str) -> None:
        super().__init__(words)
        self.words = words


class SyncBroken(Exception):
    """The answers to a sync push are no sync protocol."""


class SyncPush:
    """One sync stream of files: their messages, joined into writes of about SYNC_WRITE bytes,
    and the device's answers, read after each write as far as they came (so neither side waits on
    a full buffer) and to the end after the last."""

    def __init__(
        self,
        sock: socket.socket,
        files: Sequence[Member],
        on_stored: StoredFn | None,
    ) -> None:
        self.sock = sock
        self.files = files
        self.on_stored = on_stored
        self.stored = 0  # files the device answered OKAY
        self._answers = bytearray()
        self._ready = select.poll()  # not select(): it takes no descriptor above 1023
        self._ready.register(sock, select.POLLIN)

    def send(self, remote: str, deadline: float | None) -> None:
        """Send every file, then read the answers to the last; raises SyncFailed for a FAIL,
        TimeoutError past the ``deadline`` (a monotonic time), OSError or SyncBroken for a stream
        that broke."""
        mtime = SYNC_HEADER.pack(b"DONE", int(time.time()))
        out: list[bytes | memoryview] = []
        size = 0
        for member in self.files:
            request = b"%s,%d" % (
                posixpath.join(remote, member.name).encode(),
                REGULAR_FILE | member.mode & PUSH_MODE_BITS,
            )
            if len(request) > SYNC_PATH_MAX:
                raise SyncFailed(f"the path of {member.name} is longer than adb carries")
            out.append(SYNC_HEADER.pack(b"SEND", len(request)) + request)
            written = 0
            for data in member.read():
                view = memoryview(data)
                for start in range(0, len(view), SYNC_DATA):
                    piece = view[start : start + SYNC_DATA]
                    out += (SYNC_HEADER.pack(b"DATA", len(piece)), piece)
                    size += SYNC_HEADER.size + len(piece)
                    if size >= SYNC_WRITE:
                        self._write(out, deadline)
                        out, size = [], 0
                written += len(view)
            member.check(written)
            out.append(mtime)
        out.append(SYNC_HEADER.pack(b"QUIT", 0))
        self._write(out, deadline)
        while self.stored < len(self.files):
            self._read(deadline)

    def _write(self, out: list[bytes | memoryview], deadline: float | None) -> None:
        self.sock.settimeout(_left(deadline))
        try:
            self.sock.sendall(b"".join(out))
        except OSError:
            self._read_failure()  # a device that answered FAIL closed the stream: say its words
            raise
        while self.stored < len(self.files) and self._ready.poll(0):
            self._read(deadline)

    def _read(self, deadline: float | None) -> None:
        """Read what came of the answers (waiting for some), and take every whole one."""
        self.sock.settimeout(_left(deadline))
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the device ended the stream")
        self._answers += data
        self._take()

    def _take(self) -> None:
        answers = self._answers
        while len(answers) >= SYNC_HEADER.size:
            ident, length = SYNC_HEADER.unpack_from(answers)
            if ident == b"OKAY":
                if self.stored == len(self.files):
                    raise SyncBroken("an OKAY for a file that was not sent")
                del answers[: SYNC_HEADER.size]
                member = self.files[self.stored]
                self.stored += 1
                if self.on_stored:
                    self.on_stored(member)
            elif ident == b"FAIL" and length <= SYNC_FAIL_MAX:
                if len(answers) < SYNC_HEADER.size + length:
                    return
                words = answers[SYNC_HEADER.size : SYNC_HEADER.size + length]
                raise SyncFailed(words.decode(errors="replace").strip())
            else:
                raise SyncBroken(f"{bytes(answers[:4])!r} where OKAY or FAIL belongs")

    def _read_failure(self) -> None:
        """After a write failed: raise the device's FAIL, should its words have come."""
        with contextlib.suppress(OSError, SyncBroken):
            while self._ready.poll(100):
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                self._answers += data
                self._take()


def _left(deadline: float | None) -> float | None:
    """A socket timeout for what is left until ``deadline``; TimeoutError once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the transfer's time is up")
    return left


def adb_server_port(environ: Mapping[str, str]) -> int:
    """The port adb clients use: ANDROID_ADB_SERVER_PORT, else adb's default 5037."""
    value = environ.get("ANDROID_ADB_SERVER_PORT", "")
    return int(value) if value.isdigit() else DEFAULT_SERVER_PORT


def adb_error(result: proc.Result) -> str:
    """adb's own error line (push/pull print theirs on stdout), else its last words."""
    text = f"{result.stdout}\n{result.stderr}"
    errors = [line.strip() for line in text.splitlines() if "error:" in line]
    if errors:
        return errors[0].removeprefix("adb: error: ")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else f"adb exited with {result.returncode}"
