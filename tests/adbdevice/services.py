"""The services the test device offers on a stream: shell (protocol v2 and old-style) and sync."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO

from tests.adbdevice.fs import DeviceFs
from tests.adbdevice.streams import Stream, StreamClosed
from tests.adbdevice.wire import (
    DENT_V1,
    DENT_V2,
    SHELL_CLOSE_STDIN,
    SHELL_EXIT,
    SHELL_HEADER,
    SHELL_STDERR,
    SHELL_STDIN,
    SHELL_STDOUT,
    STAT_V1,
    STAT_V2,
    SYNC_DATA_MAX,
    SYNC_HEADER,
    SYNC_PATH_MAX,
    shell_packet,
    sync_status,
)


class Faults:
    """Failures and slowness a test arms on the device."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drop_send_after: int | None = None
        self.send_delay = 0.0  # seconds the device stalls after each chunk of a push (a slow link)

    def drop_send_after(self, nbytes: int) -> None:
        """The next push loses its connection after ``nbytes`` bytes of file data arrived."""
        with self._lock:
            self._drop_send_after = nbytes

    def send_limit(self) -> int | None:
        with self._lock:
            limit, self._drop_send_after = self._drop_send_after, None
            return limit

    def input_cut(self, received: int) -> int | None:
        """For a shell command that has read ``received`` bytes of stdin: where to cut it, if the
        armed fault is reached (that disarms it); a command with less input leaves it armed."""
        with self._lock:
            limit = self._drop_send_after
            if limit is None or received < limit:
                return None
            self._drop_send_after = None
            return limit


# --- shell ---
def start_shell(fs: DeviceFs, command: bytes, *, merge_stderr: bool) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        fs.shell_argv(command),
        cwd=fs.root,
        env=fs.shell_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        start_new_session=True,  # its own process group, which the device's stop ends
        preexec_fn=fs.shell_setup,
    )
    fs.started[:] = [*(other for other in fs.started if other.poll() is None), child]
    return child


def hang_up(child: subprocess.Popen[bytes]) -> None:
    """The host went away: as adbd does (daemon/shell_service.cpp), SIGHUP to the shell alone, and
    its pipes closed (a command that ignores SIGHUP goes on; its writes then fail)."""
    if child.poll() is None:
        try:
            os.kill(child.pid, signal.SIGHUP)
        except ProcessLookupError:
            pass
    close_quietly(child.stdin)


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by a signal: 128+N like sh


def pump(source: IO[bytes], fs: DeviceFs, send: Callable[[bytes], None]) -> None:
    rewriter = fs.output_rewriter()
    try:
        for chunk in iter(lambda: source.read1(65536), b""):  # type: ignore[attr-defined]
            if out := rewriter.feed(chunk):
                send(out)
        if rest := rewriter.flush():
            send(rest)
    except StreamClosed:
        close_quietly(source)  # as adbd closes its end: the command's next write fails


def close_quietly(handle: IO[bytes] | None) -> None:
    try:
        if handle:
            handle.close()
    except OSError:
        pass


def shell_v2(stream: Stream, fs: DeviceFs, command: bytes, faults: Faults) -> None:
    """``shell,v2,...:CMD``: stdout, stderr and the exit code as separate packets."""
    with start_shell(fs, command, merge_stderr=False) as child:
        assert child.stdout is not None and child.stderr is not None
        pumps = [
            threading.Thread(
                target=pump,
                args=(
                    child.stdout,
                    fs,
                    lambda data: stream.write(shell_packet(SHELL_STDOUT, data)),
                ),
            ),
            threading.Thread(
                target=pump,
                args=(
                    child.stderr,
                    fs,
                    lambda data: stream.write(shell_packet(SHELL_STDERR, data)),
                ),
            ),
        ]
        for thread in pumps:
            thread.start()
        threading.Thread(target=shell_v2_input, args=(stream, child, faults), daemon=True).start()
        code = exit_status(child.wait())
        for thread in pumps:
            thread.join()
    stream.write(shell_packet(SHELL_EXIT, bytes([code & 0xFF])))


def shell_v2_input(stream: Stream, child: subprocess.Popen[bytes], faults: Faults) -> None:
    received = 0
    try:
        while True:
            kind, length = SHELL_HEADER.unpack(stream.read_exact(SHELL_HEADER.size))
            data = stream.read_exact(length)
            if kind == SHELL_STDIN and (cut := faults.input_cut(received + len(data))) is not None:
                data = data[: cut - received]
                if child.stdin:
                    child.stdin.write(data)
                    child.stdin.flush()
                stream.owner.drop()  # the injected fault: the device vanishes mid-stream
                hang_up(child)
                return
            received += len(data) if kind == SHELL_STDIN else 0
            if kind == SHELL_STDIN and child.stdin:
                try:
                    child.stdin.write(data)
                    child.stdin.flush()
                except (BrokenPipeError, ValueError):
                    pass
            elif kind == SHELL_CLOSE_STDIN:
                close_quietly(child.stdin)
            # window size changes mean nothing without a pty
    except StreamClosed:
        hang_up(child)


def shell_raw(stream: Stream, fs: DeviceFs, command: bytes) -> None:
    """Old-style ``shell:CMD`` / ``exec:CMD``: one byte stream both ways, no exit code."""
    with start_shell(fs, command, merge_stderr=True) as child:
        assert child.stdout is not None and child.stdin is not None
        stdin = child.stdin

        def forward_input() -> None:
            while data := stream.read_some():
                try:
                    stdin.write(data)
                    stdin.flush()
                except (BrokenPipeError, ValueError):
                    break
            if stream.closed.is_set():
                hang_up(child)

        threading.Thread(target=forward_input, daemon=True).start()
        pump(child.stdout, fs, stream.write)


# --- sync ---
def stat_v2_record(ident: bytes, path: os.PathLike[str], *, follow: bool) -> bytes:
    try:
        st = os.stat(path, follow_symlinks=follow)
    except OSError as exc:
        return STAT_V2.pack(ident, exc.errno or 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return STAT_V2.pack(
        ident,
        0,
        st.st_dev,
        st.st_ino,
        st.st_mode,
        st.st_nlink,
        st.st_uid,
        st.st_gid,
        st.st_size,
        int(st.st_atime),
        int(st.st_mtime),
        int(st.st_ctime),
    )


def stat_v1_record(path: os.PathLike[str]) -> bytes:
    try:
        st = os.lstat(path)
    except OSError:
        return STAT_V1.pack(b"STAT", 0, 0, 0)
    return STAT_V1.pack(b"STAT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime) & 0xFFFFFFFF)


def fail(stream: Stream, message: str) -> None:
    stream.write(sync_status(b"FAIL", message.encode()))


class SendBudget:
    """Where an armed drop cuts one sync stream (one ``adb push``, however many files it sends):
    armed by the stream's first SEND, counted over all of its files."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self.armed = False
        self.left: int | None = None

    def take(self, size: int) -> int | None:
        """How many of the next ``size`` bytes arrive before the drop (None: all, no drop)."""
        if not self.armed:
            self.armed, self.left = True, self.faults.send_limit()
        if self.left is None or size < self.left:
            self.left = None if self.left is None else self.left - size
            return None
        return self.left


def sync(stream: Stream, fs: DeviceFs, faults: Faults) -> None:
    """``sync:``: STAT/STA2/LST2, LIST/LIS2, SEND, RECV until QUIT."""
    budget = SendBudget(faults)
    while True:
        try:
            ident, length = SYNC_HEADER.unpack(stream.read_exact(SYNC_HEADER.size))
        except StreamClosed:
            return
        if ident == b"QUIT":
            return
        if length > SYNC_PATH_MAX:
            return fail(stream, f"path too long: {length}")
        request = stream.read_exact(length)
        if ident == b"STAT":
            stream.write(stat_v1_record(fs.host_path(request)))
        elif ident in (b"STA2", b"LST2"):
            stream.write(stat_v2_record(ident, fs.host_path(request), follow=ident == b"STA2"))
        elif ident in (b"LIST", b"LIS2"):
            list_dir(stream, fs, request, v2=ident == b"LIS2")
        elif ident == b"SEND":
            if not receive_file(stream, fs, budget, request):
                return
        elif ident == b"RECV":
            if not send_file(stream, fs, request):
                return
        else:
            return fail(stream, f"unknown sync command {ident!r}")


def list_dir(stream: Stream, fs: DeviceFs, path: bytes, *, v2: bool) -> None:
    folder = fs.host_path(path)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        names = []
    for name in names:
        encoded = os.fsencode(name)
        if v2:
            record = stat_v2_record(b"DNT2", folder / name, follow=False)
            stream.write(record + len(encoded).to_bytes(4, "little") + encoded)
        else:
            mode, size, mtime = STAT_V1.unpack(stat_v1_record(folder / name))[1:]
            stream.write(DENT_V1.pack(b"DENT", mode, size, mtime, len(encoded)) + encoded)
    stream.write(b"DONE" + bytes((DENT_V2 if v2 else DENT_V1).size - 4))


def drain_send(stream: Stream) -> None:
    """After a FAIL, swallow the rest of the file the host keeps sending (as adbd does)."""
    while True:
        ident, length = SYNC_HEADER.unpack(stream.read_exact(SYNC_HEADER.size))
        if ident != b"DATA":
            return
        stream.read_exact(length)


def receive_file(stream: Stream, fs: DeviceFs, budget: SendBudget, request: bytes) -> bool:
    """SEND "path,mode": DATA chunks, then DONE with the mtime. Like adbd, a regular file is
    unlinked first and a transfer that fails removes the partial file."""
    path_text, _, mode_text = request.rpartition(b",")
    try:
        mode = int(mode_text)
    except ValueError:
        fail(stream, f"bad SEND mode {mode_text!r}")
        return False
    target = fs.host_path(path_text)
    if stat.S_ISLNK(mode):
        link = receive_data(stream, budget)
        if link is None:
            return False
        target.unlink(missing_ok=True)
        os.symlink(link[0].rstrip(b"\0"), target)  # the client sends the target NUL-terminated
        stream.write(sync_status(b"OKAY"))
        return True
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file() or target.is_symlink():
            target.unlink()
        handle = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o777)
    except OSError as exc:
        fail(stream, f"couldn't create file: {exc.strerror}")
        drain_send(stream)
        return False
    with open(handle, "wb") as sink:
        received = receive_data(stream, budget, sink)
    if received is None:
        target.unlink(missing_ok=True)
        return False
    os.chmod(target, mode & 0o777)
    os.utime(target, (received[1], received[1]))
    stream.write(sync_status(b"OKAY"))
    return True


def receive_data(
    stream: Stream, budget: SendBudget, sink: IO[bytes] | None = None
) -> tuple[bytes, int] | None:
    """Read DATA chunks until DONE: (data kept when no sink, mtime); None if the transfer broke."""
    kept = bytearray()
    try:
        while True:
            ident, length = SYNC_HEADER.unpack(stream.read_exact(SYNC_HEADER.size))
            if ident == b"DONE":
                return bytes(kept), length
            if ident != b"DATA" or length > SYNC_DATA_MAX:
                fail(stream, f"invalid data message {ident!r}")
                return None
            data = stream.read_exact(length)
            if (cut := budget.take(len(data))) is not None:
                data = data[:cut]
                stream.owner.drop()  # the injected fault: the device vanishes mid-file
            if sink:
                sink.write(data)
            else:
                kept += data
            if stream.closed.is_set():
                return None
            if budget.faults.send_delay:
                time.sleep(budget.faults.send_delay)
    except StreamClosed:
        return None


def send_file(stream: Stream, fs: DeviceFs, request: bytes) -> bool:
    """RECV path: DATA chunks of at most 64 KiB, then DONE."""
    try:
        source = open(fs.host_path(request), "rb")
    except OSError as exc:
        fail(stream, f"open failed: {exc.strerror}")
        return False
    pending = (
        bytearray()
    )  # DATA records batched into WRTEs of the agreed size, as adbd's socket does
    with source:
        while chunk := source.read(SYNC_DATA_MAX):
            pending += sync_status(b"DATA", chunk)
            if len(pending) >= stream.owner.max_payload:
                stream.write(bytes(pending))
                pending.clear()
    stream.write(bytes(pending) + SYNC_HEADER.pack(b"DONE", 0))
    return True
