"""The local transport: this machine as the device, with a staging dir as its root."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from kzbuild.adapters import proc
from kzbuild.device.base import (
    PUSH_MODE_BITS,
    ByteSink,
    ByteSource,
    ProgressFn,
    RemoteResult,
    device_full,
)
from kzbuild.errors import CommandFailed, DeviceError

COPY_CHUNK = 1 << 20


class LocalTransport:
    def __init__(self, root: str) -> None:
        self.root = root

    @property
    def address(self) -> str:
        return f"local:{self.root}"

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
        if on_stdout is None and on_stderr is None:
            try:
                result = proc.run_bytes(argv, cwd=cwd, env=env, check=False, timeout=timeout)
            except CommandFailed as exc:  # only raised for a timeout when check=False
                raise DeviceError(f"{self.address}: {exc.message}") from exc
            return RemoteResult(result.returncode, result.stdout, result.stderr.encode())
        try:
            code, out, err = proc.run_split(
                argv, cwd=cwd, env=env, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr
            )
        except CommandFailed as exc:
            raise DeviceError(f"{self.address}: {exc.message}") from exc
        return RemoteResult(code, out, err)

    def run_input(
        self, argv: Sequence[str], data: ByteSource, *, timeout: float | None = None
    ) -> RemoteResult:
        try:
            code, out, err = proc.run_split(argv, timeout=timeout, stdin=data)
        except CommandFailed as exc:
            raise DeviceError(f"{self.address}: {exc.message}") from exc
        return RemoteResult(code, out, err)

    def push(self, local: Path, remote: str, *, progress: ProgressFn | None = None) -> None:
        self._copy(local, remote, 0, progress)
        os.chmod(remote, local.stat().st_mode & PUSH_MODE_BITS)

    def _copy(self, local: Path, remote: str, offset: int, progress: ProgressFn | None) -> None:
        sent = 0
        try:
            with open(local, "rb") as src, open(remote, "r+b" if offset else "wb") as dst:
                src.seek(offset)
                dst.seek(offset)
                dst.truncate()
                while chunk := src.read(COPY_CHUNK):
                    dst.write(chunk)
                    sent += len(chunk)
                    if progress:
                        progress(sent)
        except OSError as exc:
            if exc.filename == str(local):
                raise DeviceError(f"cannot read {local}: {exc.strerror}") from exc
            detail = f"writing {remote} failed after {offset + sent} bytes: {exc.strerror}"
            if exc.errno == errno.ENOSPC:
                raise device_full(self.address, detail) from exc
            raise DeviceError(f"{self.address}: {detail}") from exc

    def pull(self, remote: str, local: Path) -> None:
        shutil.copyfile(remote, local)

    def close(self) -> None:
        pass
