"""The one process runner: argv lists only, logged shell-quoted, with timeouts.

Every external command kzbuild runs (git, pip, cmake, ninja, adb, ...) goes through
:func:`run` or :func:`stream` (and one it runs without a process, a device command on the adb
server's socket, through :func:`log_call`), so ``kzbuild -v`` shows all of them and nothing is ever
pasted into a shell string. Credentials in URLs (``redis://:PASSWORD@host``) are redacted
from every command line it logs or puts in an error (:func:`redact`).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generic, TypeVar, cast

from kzbuild.errors import CommandFailed, NotAvailableHere
from kzbuild.model.urls import (
    redact as redact,
)  # proc.redact: what every logged command and error goes through

log = logging.getLogger("kzbuild.adapters.proc")
STOP_GRACE = 2.0  # seconds an interrupted command gets to end after SIGTERM


class RedactCredentials(logging.Filter):
    """A logging filter that redacts URL credentials from every record (warnings name caches by
    URL)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "://" in (message := record.getMessage()):
            record.msg, record.args = redact(message), None
        return True


def _failed(argv: Sequence[str], returncode: int, stderr: str) -> CommandFailed:
    return CommandFailed([redact(arg) for arg in argv], returncode, redact(stderr))


Output = TypeVar("Output", str, bytes)
# where a long operation (a fetch, a download, a sync) sends its latest progress line
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Captured(Generic[Output]):
    """What a finished command left: its exit code, its stdout (text or bytes) and its stderr
    (text)."""

    argv: list[str]
    returncode: int
    stdout: Output
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass(frozen=True)
class Result(Captured[str]):
    """What run() captured: stdout as text."""


@dataclass(frozen=True)
class BytesResult(Captured[bytes]):
    """What run_bytes() captured: stdout as the command wrote it (a blob, a binary's output)."""


def describe(
    argv: Sequence[str], cwd: Path | str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The command as a user could paste it into a shell."""
    parts = []
    if cwd is not None:
        parts.append(f"(cd {shlex.quote(str(cwd))} &&")
    if env:
        parts.append(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    parts.append(shlex.join(argv))
    text = redact(" ".join(parts))
    return text + ")" if cwd is not None else text


def log_call(
    argv: Sequence[str], cwd: Path | str | None = None, env: Mapping[str, str] | None = None
) -> None:
    """Log a command as the runner logs those it starts: for a command kzbuild runs without a
    process of its own (a device command on the adb server's socket is logged as the ``adb``
    client command it stands for)."""
    log.info("$ %s", describe(argv, cwd, env))


def require(program: str, *, why: str = "") -> str:
    """Absolute path of ``program`` on PATH, or NotAvailableHere."""
    found = shutil.which(program)
    if found is None:
        raise NotAvailableHere(
            f"'{program}' is not installed or not on PATH" + (f" ({why})" if why else ""),
        )
    return found


def _described_replacing(
    args: list[str], cwd: Path | str | None, env: Mapping[str, str] | None
) -> str:
    """describe() for a command given a whole environment: only what it changes from ours is shown
    (``env -u`` for what it drops); the rest is the user's own environment, long, maybe secret."""
    if env is None:
        return describe(args, cwd)
    changed = {key: value for key, value in env.items() if os.environ.get(key) != value}
    dropped = [part for key in sorted(os.environ) if key not in env for part in ("-u", key)]
    return describe(["env", *dropped, *args] if dropped else args, cwd, changed)


def _environment(env: Mapping[str, str] | None, replace_env: bool) -> dict[str, str] | None:
    if env is None:
        return None
    if replace_env:
        return dict(env)
    merged = dict(os.environ)
    merged.update(env)
    return merged


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    quiet_env: Mapping[str, str] | None = None,
    replace_env: bool = False,
    check: bool = True,
    input: str | None = None,
    timeout: float | None = None,
) -> Result:
    """Run ``argv`` to completion, capturing its output as text. Raises CommandFailed when
    ``check``.

    ``quiet_env`` is added to the environment like ``env`` but left out of the log line
    (settings every call of a kind shares, such as git's config isolation).
    """
    args, completed = _completed(
        argv, cwd, env, quiet_env, replace_env, check, input, timeout, text=True
    )
    return Result(args, completed.returncode, completed.stdout, completed.stderr)


def run_bytes(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    quiet_env: Mapping[str, str] | None = None,
    check: bool = True,
    input: bytes | None = None,
    timeout: float | None = None,
) -> BytesResult:
    """run(), with stdin and stdout as bytes (stderr still text, for messages)."""
    args, completed = _completed(
        argv, cwd, env, quiet_env, False, check, input, timeout, text=False
    )
    return BytesResult(
        args, completed.returncode, completed.stdout, completed.stderr.decode(errors="replace")
    )


def _completed(
    argv: Sequence[str | os.PathLike[str]],
    cwd: Path | str | None,
    env: Mapping[str, str] | None,
    quiet_env: Mapping[str, str] | None,
    replace_env: bool,
    check: bool,
    input: str | bytes | None,
    timeout: float | None,
    *,
    text: bool,
) -> tuple[list[str], subprocess.CompletedProcess[Any]]:
    args = [os.fspath(a) for a in argv]
    log.info(
        "$ %s", _described_replacing(args, cwd, env) if replace_env else describe(args, cwd, env)
    )
    try:
        completed = subprocess.run(
            args,
            cwd=cwd,
            env=_environment(
                {**(quiet_env or {}), **(env or {})} if env or quiet_env else None, replace_env
            ),
            input=input,
            capture_output=True,
            timeout=timeout,
            text=text,
            errors="replace" if text else None,
        )
    except FileNotFoundError as exc:
        raise NotAvailableHere(f"'{args[0]}' is not installed or not on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise _failed(args, -1, f"timed out after {timeout} s") from exc
    if check and completed.returncode != 0:
        stderr = completed.stderr if text else completed.stderr.decode(errors="replace")
        raise _failed(args, completed.returncode, stderr)
    return args, completed


def stream(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    quiet_env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    log_file: Path | None = None,
    check: bool = True,
    timeout: float | None = None,
) -> int:
    """Run ``argv`` with stdout and stderr merged, handing each line to ``on_line``.

    Used for long commands (builds) whose progress is shown live and whose full log is kept.
    Returns the exit code; raises CommandFailed (with the output tail) when ``check``.
    """
    args = [os.fspath(a) for a in argv]
    log_call(args, cwd, env)
    tail: list[str] = []
    sink = open(log_file, "a", encoding="utf-8") if log_file else None
    proc: subprocess.Popen[str] | None = None
    try:
        if sink:
            sink.write(f"$ {describe(args, cwd, env)}\n")
        try:
            proc = subprocess.Popen(
                args,
                cwd=cwd,
                env=_environment(
                    {**(quiet_env or {}), **(env or {})} if env or quiet_env else None, False
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
        except FileNotFoundError as exc:
            raise NotAvailableHere(f"'{args[0]}' is not installed or not on PATH") from exc
        assert proc.stdout is not None
        try:
            for line in _lines(proc.stdout):
                if sink:
                    sink.write(redact(line) + "\n")
                tail.append(line)
                del tail[:-40]
                if on_line:
                    on_line(line)
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    except BaseException:  # interrupted (Ctrl-C, or SIGTERM where a command turns it into one)
        if proc is not None and proc.poll() is None:
            _stop(proc)  # the step stops with us, and leaves no writer in a folder being removed
        raise
    finally:
        if sink:
            sink.close()
    if check and code != 0:
        raise _failed(args, code, "\n".join(tail))
    return code


def run_split(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    on_stdout: Callable[[bytes], None] | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
    stdin: Iterable[bytes] | None = None,
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` streaming stdout and stderr separately, as bytes, to their callbacks.

    Output with no callback is kept and returned. ``stdin`` is fed to the command piece by
    piece, then closed (without it, stdin is empty). A timeout kills the command and raises
    CommandFailed.
    """
    args = [os.fspath(a) for a in argv]
    log_call(args, cwd, env)
    try:
        child = subprocess.Popen(
            args,
            cwd=cwd,
            env=_environment(env, False),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise NotAvailableHere(f"'{args[0]}' is not installed or not on PATH") from exc
    kept = (bytearray(), bytearray())
    sink_failures: list[Exception] = []

    def feed(handle: IO[bytes], pieces: Iterable[bytes]) -> None:
        try:
            for piece in pieces:
                handle.write(piece)
        except BrokenPipeError:
            pass  # the command stopped reading: its exit code says why
        except Exception as exc:
            sink_failures.append(
                exc
            )  # reading the input failed (a local file vanished): raised below
        finally:
            try:
                handle.close()
            except BrokenPipeError:
                pass

    def pump(handle: IO[bytes], sink: Callable[[bytes], None] | None, store: bytearray) -> None:
        try:
            for chunk in iter(lambda: os.read(handle.fileno(), 65536), b""):
                if sink:
                    sink(chunk)
                else:
                    store += chunk
        except Exception as exc:
            # a sink that takes no more (stdout piped into head): close our end, so the command
            # gets SIGPIPE as in a plain pipeline instead of blocking forever on a full pipe
            sink_failures.append(exc)
            handle.close()

    pipes = (
        cast(IO[bytes], child.stdout),
        cast(IO[bytes], child.stderr),
    )  # both PIPE, so never None
    pumps = [
        threading.Thread(target=pump, args=(pipes[0], on_stdout, kept[0]), daemon=True),
        threading.Thread(target=pump, args=(pipes[1], on_stderr, kept[1]), daemon=True),
    ]
    if stdin is not None:
        pumps.append(threading.Thread(target=feed, args=(child.stdin, stdin), daemon=True))
    for thread in pumps:
        thread.start()
    # a timer kills the command at the timeout: wait(timeout=...) polls, sleeping up to 50 ms past
    # the command's end (for every device command of a deploy)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        child.kill()

    timer = threading.Timer(timeout, expire) if timeout is not None else None
    if timer:
        timer.daemon = True
        timer.start()
    interrupted = False
    try:
        code = child.wait()
    except BaseException:  # Ctrl-C: the command ends too, so the caller's cleanup (a lock) runs
        interrupted = True
        _stop(child)
        raise
    finally:
        if timer:
            timer.cancel()
        for thread in pumps:  # after an interrupt, a grandchild may still hold a pipe open
            thread.join(timeout=STOP_GRACE if interrupted else None)
        for pipe in pipes:
            pipe.close()
    if expired.is_set():
        raise _failed(args, -1, f"timed out after {timeout} s")
    if sink_failures:
        raise sink_failures[0]
    return code, bytes(kept[0]), bytes(kept[1])


def _stop(child: subprocess.Popen[Any]) -> None:
    """End a command whose caller was interrupted: SIGTERM, then SIGKILL after STOP_GRACE."""
    child.terminate()
    try:
        child.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _lines(handle: Iterable[str]) -> Iterable[str]:
    for line in handle:
        yield line.rstrip("\n")
