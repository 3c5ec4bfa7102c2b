"""The adb transport: the real ``adb`` client, ``-s SERIAL``, shell protocol v2 for exit codes.

Every call goes through :mod:`kzbuild.adapters.proc`. The adb server port comes from ``server_port``
or, as adb itself does, from ``ANDROID_ADB_SERVER_PORT`` in the environment (default 5037).

Commands run as ``adb -s SERIAL shell -n -T -- CMD`` where CMD is built by
:func:`~kzbuild.device.base.remote_command`, so every argument is shell-quoted once and
arrives unchanged; a device script (``sh -c SCRIPT NAME ARGS...``) runs in the shell adbd starts
(``set -- ARGS...; SCRIPT``: the same parse, one shell process less on the device). adb 29's
client exits 0 when the connection drops before the command's exit packet, so every command ends
with a line on stderr that carries its exit code and a random token (an EXIT trap of the device's
shell, so it comes after anything the command wrote); the transport takes it off. A command
without that line did not finish: the transport then asks the adb server whether the device is
still online, and a lost device is a DeviceError, never a silent success. (Asking after every
command cost an adb client process each.)
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from kzbuild.adapters import proc
from kzbuild.device.base import (
    NO_SPACE,
    ByteSink,
    ByteSource,
    ProgressFn,
    RemoteResult,
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
EXIT_MARK = "kz-exit-"  # then a random token, a space and the exit code, on stderr's last line


class AdbTransport:
    """One device through the adb server; opening it connects and checks it is online.

    Options (``registry.connect(device, **options)``): ``server_port`` (else the adb
    default: ANDROID_ADB_SERVER_PORT, else 5037); ``connect_timeout`` for ``adb connect``,
    for waiting out an ``offline`` state and for each state query; ``transfer_timeout``
    for each push and pull (None: no limit); ``progress_interval`` between size polls of
    a push of 4 MiB or more. An adb client error while the device stays online (a service
    the device refuses) comes back as exit code 1 with adb's words on stderr.
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
        self._server = server_address(device.server, server_port)
        self._wait_online()

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
        trailer = ExitTrailer(on_stderr)
        try:
            code, out, err = proc.run_split(
                self._device_argv("shell", "-n", "-T", "--", trailer.wrap(argv, cwd, env)),
                timeout=timeout,
                on_stdout=on_stdout,
                on_stderr=trailer.feed if on_stderr else None,
            )
        except CommandFailed as exc:  # run_split raises only for the timeout
            raise DeviceError(
                f"{self.address}: '{shlex.join(argv)}' {exc.stderr}; the adb client was stopped"
            ) from exc
        return self._finished(argv, trailer, code, out, err)

    def run_input(
        self, argv: Sequence[str], data: ByteSource, *, timeout: float | None = None
    ) -> RemoteResult:
        """``adb shell -T`` without ``-n``: the shell protocol v2 carries stdin, then closes it."""
        trailer = ExitTrailer(None)
        try:
            code, out, err = proc.run_split(
                self._device_argv("shell", "-T", "--", trailer.wrap(argv, None, None)),
                timeout=timeout,
                stdin=data,
            )
        except CommandFailed as exc:
            raise DeviceError(
                f"{self.address}: '{shlex.join(argv)}' {exc.stderr}; the adb client was stopped"
            ) from exc
        return self._finished(argv, trailer, code, out, err)

    def _finished(
        self, argv: Sequence[str], trailer: ExitTrailer, code: int, out: bytes, err: bytes
    ) -> RemoteResult:
        """The command's result; without its exit line, only once the device is known online."""
        err = trailer.end(err)
        if trailer.code is None:
            self._check_online(f"while running {argv[0]}")
            return RemoteResult(code, out, err)
        return RemoteResult(trailer.code, out, err)

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

    def push_tree(self, local: Path, remote: str) -> None:
        """``adb push DIR/. REMOTE``: the sync protocol, one transfer for every file (adbd
        removes a file whose transfer was cut)."""
        result = self._transfer("push", f"{local}/.", remote)
        if not result.ok:
            self._check_online(f"while pushing to {remote}")
            words = adb_error(result)
            if NO_SPACE in words:
                raise device_full(self.address, f"writing {remote}/ failed: {words}")
            raise DeviceError(f"{self.address}: push {local} -> {remote} failed: {words}")

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
        stat = self._device_argv(
            "shell", "-n", "-T", "--", remote_command(["stat", "-c", "%s", remote])
        )
        reported = 0
        while not done.wait(self.progress_interval):
            try:
                result = proc.run(stat, check=False, timeout=self.connect_timeout)
            except CommandFailed:
                continue
            text = result.stdout.strip()
            if result.ok and text.isdigit() and int(text) > reported and not done.is_set():
                reported = int(text)
                progress(reported)

    def _state(self) -> tuple[str, str]:
        """The adb server's view of the device:
        (device|offline|unauthorized|connecting|missing|other, adb's words).

        Asked on the adb server's own socket (what ``adb get-state`` sends it, without starting an
        adb client: a process costs 3 ms of CPU); through the adb client when that fails (no
        server running yet: the client starts one)."""
        answer = self._ask_server(f"host-serial:{self.serial}:get-state")
        if answer is not None:
            ok, text = answer
        else:
            try:
                result = proc.run(
                    self._device_argv("get-state"), check=False, timeout=self.connect_timeout
                )
            except CommandFailed as exc:
                raise DeviceError(
                    f"{self.address}: the adb server did not answer: {exc.stderr}"
                ) from exc
            ok, text = result.ok, result.stdout if result.ok else result.stderr
        text = text.strip()
        if ok:
            return text, ""
        for state, marker in (
            ("unauthorized", "unauthorized"),
            ("offline", "offline"),
            ("connecting", "still connecting"),
            ("connecting", "still authorizing"),
            ("missing", "not found"),
            ("missing", "no devices"),
        ):
            if marker in text:
                return state, text
        return "other", text

    def _ask_server(self, request: str) -> tuple[bool, str] | None:
        """The adb server's answer to one host request (OKAY or FAIL, and its words), on its
        socket; None when it cannot be asked there."""
        if self._server is None:
            return None
        data = request.encode()
        try:
            with socket.create_connection(self._server, timeout=self.connect_timeout) as sock:
                sock.sendall(b"%04x%s" % (len(data), data))
                reply = sock.makefile("rb")
                status = reply.read(4)
                length = int(reply.read(4), 16)
                words = reply.read(length)
        except (OSError, ValueError):
            return None
        if status not in (b"OKAY", b"FAIL") or len(words) != length:
            return None
        return status == b"OKAY", words.decode(errors="replace")

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


class ExitTrailer:
    """The line a device command ends with on stderr (``EXIT_MARK``, a token, its exit code), put
    there by an EXIT trap of the device's shell, and taken off again: ``code`` is that exit code,
    None when the line never came (the command did not finish). With ``sink``, stderr streams to
    it through :meth:`feed`, holding back what could be the start of the line."""

    def __init__(self, sink: ByteSink | None) -> None:
        self.sink = sink
        self.mark = f"{EXIT_MARK}{secrets.token_hex(8)}"
        self.line = re.compile(rb"\n" + self.mark.encode() + rb" ([0-9]{1,3})\n\Z")
        self.code: int | None = None
        self._held = b""

    def wrap(self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None) -> str:
        """The command line for adbd's shell: the trap, then the command (a script inline)."""
        trap = f"trap 'kz_rc=$?; {{ echo; echo \"{self.mark} $kz_rc\"; }} >&2' EXIT; "
        if len(argv) >= 3 and argv[:2] == ["sh", "-c"] and cwd is None and not env:
            return f"{trap}set -- {shlex.join(argv[4:])}; {argv[2]}"
        return trap + remote_command(argv, cwd=cwd, env=env)

    def feed(self, data: bytes) -> None:
        assert self.sink is not None
        data = self._held + data
        keep = len(self.mark) + 8  # "\n" MARK " " CODE "\n", at most
        self._held = data[-keep:]
        if data[:-keep]:
            self.sink(data[:-keep])

    def end(self, stderr: bytes) -> bytes:
        """stderr without the line (what was kept, or what :meth:`feed` held back); sets code."""
        rest = self._held if self.sink is not None else stderr
        found = self.line.search(rest)
        if found:
            self.code = int(found[1])
            rest = rest[: found.start()]
        if self.sink is not None:
            if rest:
                self.sink(rest)
            return stderr
        return rest


def server_options(server: str | None, port: int | None) -> list[str]:
    """adb's options for the server a device is served by: another machine's (``-H HOST -P PORT``),
    or this machine's on ``port`` (else adb's default: ANDROID_ADB_SERVER_PORT, else 5037)."""
    if server:
        host, _, server_port = server.rpartition(":")
        return ["-H", host.strip("[]"), "-P", server_port]
    return ["-P", str(port)] if port else []


def server_address(server: str | None, port: int | None) -> tuple[str, int] | None:
    """Where the adb client would reach its server (see :func:`server_options`); None when the
    environment names it in a way only the client reads (ADB_SERVER_SOCKET)."""
    if server:
        host, _, server_port = server.rpartition(":")
        return host.strip("[]"), int(server_port)
    if os.environ.get("ADB_SERVER_SOCKET"):
        return None
    return "localhost", port or adb_server_port(os.environ)


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
