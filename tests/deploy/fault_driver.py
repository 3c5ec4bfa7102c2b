"""Runs the kzbuild CLI with faults injected into every device transport (local, ssh, adb).

    python -m tests.deploy.fault_driver [--kill-at N] [--slow SECONDS] -- KZBUILD-ARGS...

``--kill-at N`` SIGKILLs this process at its N-th device operation, as kill -9 or a crash
would: after a command ran (the device did it, kzbuild never saw the answer), half-way
through an upload (half the file arrived; of a pushed dir, the files of half its bytes), or half-way
through a command's input (the device
ran it on the first half of its stdin: half a tar stream, half the files to assemble). ``--slow S``
sleeps S seconds after every
operation so that concurrent runs overlap. Used by tests/deploy/test_deploy_faults.py and
benchmarks/bench_faults.py.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kzbuild.cli import main
from kzbuild.device.adb import AdbTransport
from kzbuild.device.base import Member
from kzbuild.device.local import LocalTransport
from kzbuild.device.ssh import SshTransport

REPO = Path(__file__).resolve().parents[2]

TRANSPORTS: tuple[type, ...] = (LocalTransport, SshTransport, AdbTransport)


class Faults:
    def __init__(self, kill_at: int | None, slow: float) -> None:
        self.kill_at = kill_at
        self.slow = slow
        self.operations = 0

    def next_is_fatal(self) -> bool:
        self.operations += 1
        return self.operations == self.kill_at


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def faulty_run(faults: Faults, run: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(self: Any, argv: Any, **options: Any) -> Any:
        fatal = faults.next_is_fatal()
        result = run(self, argv, **options)
        if fatal:
            die()
        time.sleep(faults.slow)
        return result

    return wrapped


def faulty_push(faults: Faults, push: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(self: Any, local: Path, remote: str, **options: Any) -> Any:
        if faults.next_is_fatal():
            data = local.read_bytes()
            with tempfile.NamedTemporaryFile() as half:
                half.write(data[: len(data) // 2])
                half.flush()
                push(self, Path(half.name), remote)
            die()
        result = push(self, local, remote, **options)
        time.sleep(faults.slow)
        return result

    return wrapped


def faulty_push_files(faults: Faults, push_files: Callable[..., Any]) -> Callable[..., Any]:
    """A fatal push copies the files that make up the first half of the bytes, then dies."""

    def wrapped(self: Any, files: Sequence[Member], remote: str, **options: Any) -> Any:
        if faults.next_is_fatal():
            budget = sum(member.size for member in files) // 2
            half = []
            for member in files:
                budget -= member.size
                if budget < 0:
                    break
                half.append(member)
            push_files(self, half, remote, **options)
            die()
        result = push_files(self, files, remote, **options)
        time.sleep(faults.slow)
        return result

    return wrapped


def faulty_run_input(faults: Faults, run_input: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(self: Any, argv: Any, data: Any, **options: Any) -> Any:
        if faults.next_is_fatal():
            whole = b"".join(data)
            run_input(self, argv, iter((whole[: len(whole) // 2],)), **options)
            die()
        result = run_input(self, argv, data, **options)
        time.sleep(faults.slow)
        return result

    return wrapped


def install(faults: Faults) -> None:
    for transport in TRANSPORTS:
        setattr(transport, "run", faulty_run(faults, transport.run))  # noqa: B010 (patching a class)
        setattr(transport, "push", faulty_push(faults, transport.push))  # noqa: B010
        setattr(transport, "run_input", faulty_run_input(faults, transport.run_input))  # noqa: B010
        if hasattr(transport, "push_files"):
            wrapped = faulty_push_files(faults, transport.push_files)
            setattr(transport, "push_files", wrapped)  # noqa: B010


def command(
    kzbuild_args: Sequence[str], *, kill_at: int | None = None, slow: float = 0.0
) -> list[str]:
    """The argv that runs ``kzbuild kzbuild_args`` through this driver (from the repository
    root)."""
    driver = [sys.executable, "-m", "tests.deploy.fault_driver", "--slow", str(slow)]
    if kill_at is not None:
        driver += ["--kill-at", str(kill_at)]
    return [*driver, "--", *kzbuild_args]


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fault_driver")
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("kzbuild_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    install(Faults(args.kill_at, args.slow))
    kz_args = args.kzbuild_args[1:] if args.kzbuild_args[:1] == ["--"] else args.kzbuild_args
    return main(kz_args)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
