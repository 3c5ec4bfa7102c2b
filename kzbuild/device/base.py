"""The Transport interface every device kind implements, and the one place remote commands are
quoted.

A remote command is always built from an argv list by :func:`remote_command`: every
argument and every env value goes through ``shlex.quote``, so ``ADD|SUB`` or ``$(x)`` reach
the tool unchanged.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from kzbuild.errors import DeviceError

PUSH_MODE_BITS = 0o777  # a pushed file keeps its permissions, never setuid, setgid or sticky
NO_SPACE = "No space left on device"  # strerror(ENOSPC), as toybox and the transports report it
FULL_HINT = (
    "free space on the device (deploy --keep N drops old releases); current was left as it was"
)
ENV_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True)
class RemoteResult:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def text(self) -> str:
        return self.stdout.decode(errors="replace")


ByteSink = Callable[[bytes], None]
ByteSource = Iterable[bytes]  # data fed to a device command's stdin, in pieces
ProgressFn = Callable[[int], None]  # bytes sent so far for the current file


@dataclass(frozen=True)
class Member:
    """One file to send (a member of a tar stream, or a file of a :class:`FilePush`): ``read``
    yields its bytes."""

    name: str
    size: int
    read: Callable[[], Iterator[bytes]]
    label: str = ""  # for progress; empty: not file contents (a list)
    mode: int = 0o644  # of the device's file, when a FilePush writes it

    def check(self, written: int) -> None:
        """That ``written`` bytes, what was read of it, is its size."""
        if written != self.size:
            raise DeviceError(
                f"{self.label or self.name} changed while it was being sent"
                f" ({written} bytes instead of {self.size})"
            )


class Transport(Protocol):
    """What deploy, run and bench need from a device."""

    @property
    def address(self) -> str: ...

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
        """Run argv on the device and return its real exit code.

        With ``on_stdout``/``on_stderr`` the output is streamed to them as it arrives
        (and is not kept in the result).
        """
        ...

    def run_input(
        self, argv: Sequence[str], data: ByteSource, *, timeout: float | None = None
    ) -> RemoteResult:
        """Run argv on the device with ``data`` as its stdin (closed at the end); returns its real
        exit code.

        One round trip however much ``data`` holds: deploy streams a whole tar archive this way.
        """
        ...

    def push(self, local: Path, remote: str, *, progress: ProgressFn | None = None) -> None:
        """Copy one local file to an absolute device path whose parent exists."""
        ...

    def pull(self, remote: str, local: Path) -> None:
        """Copy one device file to a local path."""
        ...

    def close(self) -> None: ...


StoredFn = Callable[[Member], None]  # told of each file a FilePush's device holds whole


@runtime_checkable
class FilePush(Protocol):
    """A transport with a bulk file copy cheaper than a command's stdin (adb's sync protocol)."""

    def push_files(
        self, files: Sequence[Member], remote: str, *, on_stored: StoredFn | None = None
    ) -> None:
        """Copy each of ``files`` to ``remote``/its name with its mode, in order, in one transfer
        (the dirs of the names are made as needed); ``on_stored`` hears of each file the device
        holds whole. A cut copy leaves only whole files behind it."""
        ...


def device_full(address: str, detail: str) -> DeviceError:
    """The error for a device whose filesystem is full; ``detail`` names the path or command."""
    return DeviceError(f"device {address} is full: {detail}", hint=FULL_HINT)


def lacks_space(transport: Transport, directory: str, needed: int) -> bool:
    """Whether the filesystem of ``directory`` on the device has less than ``needed`` bytes free
    (for tools that report a full disk without saying so: SFTP's bare 'Failure', tar's 'Wrote
    only')."""
    try:
        result = transport.run(["df", "-k", directory])
    except DeviceError:
        return False  # the connection is gone: the caller reports the drop, not a full disk
    lines = result.text().splitlines() if result.ok else []
    fields = lines[-1].split() if lines else []
    # the last three columns are Available, Use% and the mount point (the name may wrap)
    return len(fields) >= 3 and fields[-3].isdigit() and int(fields[-3]) * 1024 < needed


def check_env_name(name: str) -> str:
    if not name or name[0].isdigit() or not set(name) <= ENV_NAME_CHARS:
        raise ValueError(f"invalid environment variable name: {name!r}")
    return name


def remote_command(
    argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """A POSIX sh command line that runs ``argv`` exactly, in ``cwd``, with ``env`` added."""
    if not argv:
        raise ValueError("empty command")
    parts: list[str] = []
    if cwd is not None:
        parts += ["cd", shlex.quote(cwd), "&&"]
    if env:
        parts.append("env")
        parts += [shlex.quote(f"{check_env_name(k)}={v}") for k, v in env.items()]
    parts += [shlex.quote(arg) for arg in argv]
    return " ".join(parts)
