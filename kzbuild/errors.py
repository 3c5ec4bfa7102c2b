"""The kzbuild error family.

Library code raises these; only the CLI turns them into a message and an exit code
(see ``kzbuild.cli``). Each class owns one exit code so scripts can tell failures apart.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path


class KzError(Exception):
    """Base class: a failure kzbuild can explain to the user."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class ConfigError(KzError):
    """Bad input in a recipe, series, patch, device or toolchain file (names file, line and key),
    or a bad value on the command line (an option, a device spec): a usage error."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        line: int | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = ""
        if path is not None:
            where = str(path)
            if line is not None:
                where += f":{line}"
            where += ": "
        if key:
            message = f"{key}: {message}"
        super().__init__(where + message, hint=hint)
        self.path = Path(path) if path is not None else None
        self.line = line
        self.key = key


class SourceError(KzError):
    """No source could provide the pinned upstream commit."""

    exit_code = 3


class WorktreeError(KzError):
    """The worktree holds work that an operation would lose (dirty files, unexported commits)."""

    exit_code = 4


class PatchError(KzError):
    """A patch of the stack does not apply (or the stack is malformed)."""

    exit_code = 5


class ToolchainMissing(KzError):
    """A toolchain a target needs is absent or has the wrong version."""

    exit_code = 6


class BuildFailed(KzError):
    """cmake or ninja failed."""

    exit_code = 7


class DeviceError(KzError):
    """The device is unreachable, refused us, or dropped mid-operation."""

    exit_code = 8


class RegressionFound(KzError):
    """A comparison found a regression past the threshold."""

    exit_code = 9


class Busy(KzError):
    """Another kzbuild process holds the lock on a cache or worktree."""

    exit_code = 10


class NotAvailableHere(KzError):
    """The operation needs something this machine does not have (NDK, SDK, tablet, docker)."""

    exit_code = 11


class OverMemoryBudget(KzError):
    """A measured run exceeded its plan's memory_budget (peak resident memory of the process) or
    htp_session_limit (the buffers of one HTP session)."""

    exit_code = 15


class LogFormatChanged(KzError):
    """The synced tree's llama.cpp logs its buffer sizes in a format kzbuild's parser was not
    written for."""

    exit_code = 16


class ResultsError(KzError):
    """Benchmark output or stored results cannot answer: unusable llama-bench output or results
    files, a selector that matches nothing, or results that must not be compared (devices, models,
    env)."""

    exit_code = 13


class BadRecord(ResultsError):
    """A benchmark record of the wrong shape (from llama-bench or a results file); the message
    names where it is, the key and the value. Raised before anything of it is stored."""


class ProfileFormatChanged(ResultsError):
    """The tree's ggml-hexagon prints its profiler lines in a format kzbuild's parser was not
    written for."""


class OutputFormatChanged(ResultsError):
    """The tree's llama-perplexity prints its KL divergence statistics in a format kzbuild's parser
    was not written for."""


class ResultsDatabaseDamaged(ResultsError):
    """results.sqlite3 is unreadable, or not the schema this kzbuild writes. The results store
    rebuilds it from the JSONL shards (the source of truth); it reaches the user only when that
    fails too."""


class Unwritable(KzError):
    """A place on this machine kzbuild must write cannot be written: a read-only or full file
    system, or no permission (the work dir, the cache dir, the results dir)."""

    exit_code = 14


UNWRITABLE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


def unwritable(exc: OSError) -> Unwritable | None:
    """The Unwritable error an OSError of a named path on this machine stands for, if it is one
    (a read-only, full or forbidden place, which the user fixes, not a bug); else None."""
    if exc.errno not in UNWRITABLE_ERRNOS or exc.filename is None:
        return None
    path = os.fsdecode(exc.filename)
    return Unwritable(
        f"cannot write {path}: {exc.strerror}",
        hint="free or remount it, or point kzbuild elsewhere (--work-dir/KZ_WORK_DIR, "
        "--cache-dir/KZ_CACHE_DIR, --results-dir/KZ_RESULTS_DIR)",
    )


class WrongOutput(KzError):
    """A variant's output is past the plan's quality limits (max_kld, min_top1): it is wrong,
    whatever its speed."""

    exit_code = 17


class CommandFailed(KzError):
    """An external command exited non-zero."""

    exit_code = 12

    def __init__(
        self, argv: Sequence[str], returncode: int, stderr: str = "", *, hint: str | None = None
    ) -> None:
        import shlex

        tail = "\n".join(stderr.strip().splitlines()[-15:])
        message = f"command failed with exit code {returncode}: {shlex.join(argv)}"
        if tail:
            message += f"\n{tail}"
        super().__init__(message, hint=hint)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
