"""An advisory file lock so two kzbuild processes never mutate one cache or worktree at once."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kzbuild.errors import Busy


@contextmanager
def locked(path: Path, *, what: str, wait: float = 10.0, shared: bool = False) -> Iterator[None]:
    """Hold a lock on ``path``; wait up to ``wait`` seconds, then raise Busy.

    Exclusive by default (for changing the thing); ``shared`` locks (for reading it, e.g. a
    build compiling a worktree) coexist with each other but not with an exclusive one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    raise Busy(
                        f"{what} is in use by another kzbuild process (pid {holder}); gave up "
                        f"after {wait:.0f} s",
                        hint=f"wait for it to finish; the lock file is {path}",
                    ) from None
                time.sleep(0.1)
        if not shared:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
