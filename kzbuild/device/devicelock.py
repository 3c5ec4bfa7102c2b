"""One writer per device root: a lock directory on the device itself, so two machines see it.

``ROOT/.lock/`` is taken with ``mkdir`` (atomic on every filesystem; toybox has it) and holds
an ``owner`` file (host, pid, since, operation, random token; see
:class:`kzbuild.model.devicelock.LockOwner`) that the device's shell writes right after the
``mkdir``. The holder rewrites ``owner`` in place between the steps of an operation: its mtime is
the heartbeat.

A lock is stale when its holder ran on this host (by name) and its pid is gone, or when its
heartbeat is older than the lease (``KZ_LOCK_LEASE`` seconds, default 600), which is what
recovers a lock of a machine that died or is unreachable. A stale lock is broken under a
second lock dir (``ROOT/.lock.break``) that only breakers and releasers take: the lock is
removed only if it still holds the token judged stale, so two breakers cannot remove a fresh
lock, and a holder removes only a lock with its own token. While it is removed the lock is a
dir without owner and a fresh mtime, which nobody breaks or takes.

``KZ_LOCK_HOST`` overrides the host name recorded (tests use it to act as two machines).
All scripts are constant strings; paths and owner fields go in as positional arguments.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone

from kzbuild.device.base import ByteSource, RemoteResult, Transport
from kzbuild.device.steps import Step, run_steps
from kzbuild.device.store import COMMAND_TIMEOUT, SHELL_FUNCTIONS, Layout, Remote
from kzbuild.errors import Busy, ConfigError, KzError
from kzbuild.model.devicelock import LockOwner, LockSighting, token_line

log = logging.getLogger(__name__)

LEASE_ENV = "KZ_LOCK_LEASE"
DEFAULT_LEASE = 600.0
MIN_LEASE, MAX_LEASE = 1.0, 30 * 86400.0
PID_MAX = 1 << 22  # Linux's largest pid_max
HOST_ENV = "KZ_LOCK_HOST"
POLL_INTERVAL = 0.5  # seconds between attempts while waiting; each attempt is one round trip
MUTEX_RETRIES = 50  # attempts at the break mutex (held for one short script at a time)
MUTEX_PAUSE = 0.1

# tokens of the locks this process holds: a lock with our pid and another token was left by an
# earlier operation of this process whose release could not reach the device
_held_tokens: set[str] = set()

# exit codes of the scripts below
HELD = 3
VANISHED = 4
MUTEX_BUSY = 5
NOT_OURS = 6

# sh: sets $t to the token in the owner file of lock dir $1 (empty when there is none)
_TOKEN_OF = (
    "token_of() { t=; { read -r _; read -r _; read -r _; read -r _; read -r t; } 2>/dev/null < "
    '"$1/owner"; }; '
)
# $1 = ROOT, $2 = the lock dir, $3 = the owner file's text, $4 = dirs to make in ROOT when ROOT is
# made (the same mkdir: a first deploy's store). Exit 0: taken. Exit 3: held, and prints the
# device's time, the heartbeat (owner's mtime, else the dir's) and the owner file. The owner is
# written by the shell itself (no process): until it is, a reader sees a lock with no owner yet,
# as between the mkdir and the write of any lock. Exit 4 (VANISHED): the lock was there for the
# mkdir and gone right after (its holder released it): try again.
ACQUIRE_SCRIPT = SHELL_FUNCTIONS + (
    'root=$1 lock=$2 owner=$3 dirs=$4; if [ ! -d "$root" ]; then set -- "$root"; '
    'for d in $dirs; do set -- "$@" "$root/$d"; done; mkdir -p "$@" || exit 1; fi; '
    'if err=$(mkdir "$lock" 2>&1); then '
    '  kz_put "$owner" > "$lock/owner" && exit 0; '
    '  rm -rf "$lock"; exit 1; '
    "fi; "
    'if [ ! -d "$lock" ]; then case $err in *"File exists"*) [ -e "$lock" ] || exit 4 ;; esac; '
    'kz_put "$err" >&2; exit 1; fi; '
    'date +%s; stat -c %Y "$lock/owner" 2>/dev/null || stat -c %Y "$lock" 2>/dev/null || exit 4; '
    'cat "$lock/owner" 2>/dev/null; exit 3'
)
# $1 = the lock dir, $2 = our token, $3 = the owner file's text. Exit 6: the lock is not ours any
# more. The heartbeat: the shell writes the owner's own text over it, in place (``<>``: the file is
# not truncated, so a reader never sees it empty, and no block is freed), which sets its mtime
# without a touch process.
REFRESH_SCRIPT = (
    SHELL_FUNCTIONS
    + _TOKEN_OF
    + 'token_of "$1"; [ -n "$2" ] && [ "$t" = "$2" ] || exit 6; kz_put "$3" 1<> "$1/owner"'
)
# $1 = the lock dir, $2 = the token it must hold ("" for a lock without owner), $3 = the lease in
# seconds. Under the break mutex: exit 0 removed, 6 it holds another token now, 5 the mutex is
# taken (a mutex older than the lease, left by a device that rebooted mid-break, is removed for
# the next attempt). While it is being removed, the lock is a dir without owner, which nobody
# breaks (its mtime is new) or takes (mkdir fails until it is gone); one rm removes it, then the
# mutex.
REMOVE_SCRIPT = _TOKEN_OF + (
    'm="$1.break"; '
    'if ! mkdir "$m" 2>/dev/null; then '
    '  age=$(( $(date +%s) - $(stat -c %Y "$m" 2>/dev/null || date +%s) )); '
    '  [ "$age" -gt "$3" ] && rmdir "$m" 2>/dev/null; exit 5; '
    "fi; "
    'token_of "$1"; '
    'if [ -d "$1" ] && [ "$t" != "$2" ]; then rmdir "$m"; exit 6; fi; '
    'rm -rf "$1" "$m" || exit 1'
)

# $1 = the lock dir. Prints nothing when there is no lock, else what ACQUIRE_SCRIPT prints when
# held.
SIGHT_SCRIPT = (
    '[ -d "$1" ] || exit 0; date +%s; stat -c %Y "$1/owner" 2>/dev/null || stat -c %Y "$1" '
    "2>/dev/null || exit 0; "
    'cat "$1/owner" 2>/dev/null; exit 0'
)


def lease_seconds() -> float:
    """The lease; a value that is not a finite number of seconds from 1 to MAX_LEASE is refused
    before any lock is touched (nan, inf and -1 would break live locks or keep dead ones)."""
    raw = os.environ.get(LEASE_ENV)
    if raw is None:
        return DEFAULT_LEASE
    try:
        lease = float(raw)
    except ValueError:
        lease = math.nan
    if not MIN_LEASE <= lease <= MAX_LEASE:  # false for nan
        raise ConfigError(
            f"{LEASE_ENV} must be a number of seconds from {MIN_LEASE:g} to {MAX_LEASE:g}, "
            f"not {raw[:40]!r}"
        )
    return lease


def host_name() -> str:
    host = os.environ.get(HOST_ENV) or socket.gethostname()
    if not host.isprintable() or any(c.isspace() for c in host) or len(host) > 255:
        raise ConfigError(
            f"{HOST_ENV} must be a host name (printable, no blanks), not {host[:40]!r}"
        )
    return host


def pid_alive(pid: int) -> bool:
    if not 0 < pid <= PID_MAX:  # pid 0 is a process group, not a holder; no pid is larger
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def is_stale(sighting: LockSighting, *, host: str, lease: float) -> bool:
    owner = sighting.owner
    if owner is not None and owner.host == host:
        if owner.pid == os.getpid():
            return owner.token not in _held_tokens
        if not pid_alive(owner.pid):
            return True
    return sighting.heartbeat_age > lease


class DeviceLock:
    """A held lock; ``refresh`` between the steps of a long operation, ``release`` at the end.

    ``then`` holds the results of the steps that ran in the same round trip as taking the lock
    (see :func:`acquire`). ``refresh_then`` and ``release_after`` put the heartbeat (and the
    release) into the round trip of the operation's own next steps.
    """

    def __init__(
        self, remote: Remote, layout: Layout, owner: LockOwner, then: Sequence[RemoteResult] = ()
    ) -> None:
        self.remote = remote
        self.layout = layout
        self.owner = owner
        self.then = list(then)
        self.released = False

    def refresh(self) -> None:
        """Renew the heartbeat; Busy if another kzbuild broke the lock as stale meanwhile."""
        self.refresh_then([])

    def refresh_then(
        self,
        steps: Sequence[Step],
        *,
        data: ByteSource | None = None,
        timeout: float = COMMAND_TIMEOUT,
    ) -> list[RemoteResult]:
        """Renew the heartbeat, then run ``steps`` (with ``data`` as their stdin), in one round
        trip.

        Busy (and none of the steps ran) if the lock is not ours any more. Returns the steps'
        results, up to the first that failed.
        """
        refresh = Step(
            REFRESH_SCRIPT,
            (self.layout.lock, self.owner.token, owner_text(self.owner)),
            "refreshing the device lock",
        )
        results = run_steps(self.remote.transport, [refresh, *steps], data=data, timeout=timeout)
        if results[0].returncode == NOT_OURS:
            raise Busy(
                f"device {self.remote.address} lost its lock {self.layout.lock}: another kzbuild "
                "judged it stale and took over",
                hint=f"raise {LEASE_ENV} above the longest step (one file upload or checksum) of "
                "an operation",
            )
        self.remote.checked([refresh], results[:1])
        return results[1:]

    def release_after(
        self,
        steps: Sequence[Step],
        *,
        data: ByteSource | None = None,
        timeout: float = COMMAND_TIMEOUT,
    ) -> list[RemoteResult]:
        """Renew the heartbeat, run ``steps`` (with ``data`` as their stdin), then release the
        lock, in one round trip.

        When a step fails (or the removal finds the break mutex taken) the lock stays held and
        ``release`` removes it as usual. Returns the steps' results, up to the first that failed.
        """
        remove = remove_step(self.layout, self.owner.token)
        results = self.refresh_then([*steps, remove], data=data, timeout=timeout)
        if len(results) > len(steps) and results[-1].returncode in (0, NOT_OURS):
            self._released(results[-1].ok)
        return results[: len(steps)]

    def _released(self, ours: bool) -> None:
        self.released = True
        _held_tokens.discard(self.owner.token)
        if not ours:
            log.warning(
                "%s: the lock %s was no longer ours at release",
                self.remote.address,
                self.layout.lock,
            )

    def release(self) -> None:
        """Remove the lock if it is still ours. A failure is logged, not raised: it must not hide
        the operation's own error, and the lock left behind is recovered as stale."""
        if self.released:
            return
        _held_tokens.discard(self.owner.token)
        try:
            if not remove_if_held_by(self.remote, self.layout, self.owner.token):
                log.warning(
                    "%s: the lock %s was no longer ours at release",
                    self.remote.address,
                    self.layout.lock,
                )
        except KzError as exc:
            log.warning(
                "%s: could not release the lock %s: %s", self.remote.address, self.layout.lock, exc
            )


@contextmanager
def device_lock(
    transport: Transport,
    root: str,
    operation: str,
    *,
    wait: float = 0.0,
    then: Sequence[Step] = (),
    make: Sequence[str] = (),
) -> Iterator[DeviceLock]:
    """Hold the device root's lock for ``operation``; wait up to ``wait`` seconds, then raise Busy.

    ``then`` runs right after the lock is taken, in the same round trip (results in ``lock.then``).
    When the root is not there yet, the dirs ``make`` (relative to it) are made with it.
    """
    lock = acquire(Remote(transport), Layout(root), operation, wait=wait, then=then, make=make)
    try:
        yield lock
    finally:
        lock.release()


def acquire(
    remote: Remote,
    layout: Layout,
    operation: str,
    *,
    wait: float,
    then: Sequence[Step] = (),
    make: Sequence[str] = (),
) -> DeviceLock:
    """Take the lock, waiting up to ``wait`` seconds; ``then`` runs in the same round trip once it
    is taken
    (their results, up to the first that failed, are the lock's ``then``)."""
    host, lease = host_name(), lease_seconds()
    since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    owner = LockOwner(host, os.getpid(), since, operation, secrets.token_hex(8))
    deadline = time.monotonic() + wait
    step = Step(
        ACQUIRE_SCRIPT,
        (layout.root, layout.lock, owner_text(owner), " ".join(make)),
        "taking the device lock",
    )
    argv = step.argv
    broken: set[str] = set()  # tokens of stale locks removed: one seen again is not broken twice
    while True:
        results = run_steps(remote.transport, [step, *then], timeout=COMMAND_TIMEOUT)
        result = results[0]
        if result.ok:
            _held_tokens.add(owner.token)
            return DeviceLock(remote, layout, owner, then=results[1:])
        if result.returncode == VANISHED:
            continue
        if result.returncode != HELD:
            raise remote.error(argv, result, what="taking the device lock")
        sighting = _parse_sighting(result.text())
        if is_stale(sighting, host=host, lease=lease) and sighting.token not in broken:
            broken.add(sighting.token)
            stale = sighting.owner
            log.warning(
                "%s: breaking the stale lock %s (%s)",
                remote.address,
                layout.lock,
                stale.describe() if stale else "no owner",
            )
            remove_if_held_by(remote, layout, sighting.token)
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _busy(remote, layout, sighting, wait, lease)
        time.sleep(min(POLL_INTERVAL, remaining))


def _parse_sighting(text: str) -> LockSighting:
    """The device's time, the heartbeat by the device's clock, and the owner file. A heartbeat in
    the device's future (its clock went back) ages as far as it is ahead: a live holder's next
    touch brings it back to now."""
    lines = text.splitlines()
    now, beat = (
        int(line) if re.fullmatch(r"[0-9]{1,12}", line.strip()) else 0
        for line in (lines + ["", ""])[:2]
    )
    owner_lines = lines[2:]
    owner = LockOwner.parse(owner_lines)
    return LockSighting(owner, float(abs(now - beat)), token_line(owner_lines))


def remove_if_held_by(remote: Remote, layout: Layout, token: str) -> bool:
    """Remove the lock if it holds ``token``; False if it holds another one."""
    argv = remove_step(layout, token).argv
    for _ in range(MUTEX_RETRIES):
        result = remote.run(argv, what="removing the device lock", check=False)
        if result.returncode == MUTEX_BUSY:
            time.sleep(MUTEX_PAUSE)
            continue
        if result.returncode == NOT_OURS:
            return False
        if not result.ok:
            raise remote.error(argv, result, what="removing the device lock")
        return True
    raise Busy(
        f"device {remote.address}: the lock {layout.lock}.break stayed taken for "
        f"{MUTEX_RETRIES * MUTEX_PAUSE:.0f} s"
    )


def remove_step(layout: Layout, token: str) -> Step:
    return Step(
        REMOVE_SCRIPT,
        (layout.lock, token, str(int(lease_seconds()))),
        "removing the device lock",
    )


def owner_text(owner: LockOwner) -> str:
    """The owner file's text (its lines, the last without its newline: the device adds it)."""
    return "\n".join(owner.lines())


def _busy(
    remote: Remote, layout: Layout, sighting: LockSighting, wait: float, lease: float
) -> Busy:
    holder = (
        sighting.owner.describe()
        if sighting.owner
        else f"a lock being taken (no owner yet, {sighting.heartbeat_age:.0f} s old)"
    )
    waited = f" (waited {wait:g} s)" if wait else ""
    return Busy(
        f"device {remote.address} is busy: {holder}{waited}",
        hint=(
            "--wait SECONDS waits for it. A lock whose holder died is recovered by itself: at "
            "once when the holder "
            "ran on this host and its pid is gone, else when its heartbeat is older than "
            f"{lease:g} s ({LEASE_ENV}). "
            f"The lock is {layout.lock}"
        ),
    )


def holder(transport: Transport, root: str) -> LockSighting | None:
    """Who holds the device root's lock, as seen now (None: nobody); read only, never taken."""
    remote = Remote(transport)
    layout = Layout(root)
    text = remote.run(
        ["sh", "-c", SIGHT_SCRIPT, "kz", layout.lock], what="reading the device lock"
    ).text()
    return _parse_sighting(text) if text.strip() else None


def is_busy(sighting: LockSighting | None) -> bool:
    """Held by a live holder (a stale lock counts as free: the next operation breaks it)."""
    return sighting is not None and not is_stale(sighting, host=host_name(), lease=lease_seconds())
