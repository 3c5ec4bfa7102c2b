"""The owner record of a device lock (``ROOT/.lock/owner`` on the device)."""

from __future__ import annotations

import re
from dataclasses import dataclass

OWNER_FIELDS = 5  # one per line: host, pid, since, operation, token
PID = re.compile(r"[0-9]{1,10}")


def token_line(lines: list[str]) -> str:
    """The token as the device's shell reads it (``read -r``: the 5th line, blanks stripped), so a
    garbled owner file (a host name holding a newline) is still removed by the token it shows."""
    return lines[OWNER_FIELDS - 1].strip(" \t") if len(lines) >= OWNER_FIELDS else ""


@dataclass(frozen=True)
class LockOwner:
    host: str  # the machine kzbuild ran on (not the device)
    pid: int
    since: str  # UTC, ISO 8601
    operation: str  # deploy | rollback | models push | verify | run | bench
    token: str  # random; a holder releases or refreshes only a lock holding its own token

    def lines(self) -> list[str]:
        return [self.host, str(self.pid), self.since, self.operation, self.token]

    @classmethod
    def parse(cls, lines: list[str]) -> LockOwner | None:
        """The owner from the owner file's lines; None when they are missing or garbled (a pid
        that is not 1 to 10 ASCII digits, no token)."""
        if len(lines) < OWNER_FIELDS or not PID.fullmatch(lines[1]) or not token_line(lines):
            return None
        host, pid, since, operation, _ = lines[:OWNER_FIELDS]
        return cls(host, int(pid), since, operation, token_line(lines))

    def describe(self) -> str:
        return f"{self.operation} by {self.host} pid {self.pid} since {self.since}"


@dataclass(frozen=True)
class LockSighting:
    """A held lock as a contender saw it: who holds it and how long since its heartbeat."""

    owner: LockOwner | None  # None: the lock dir has no (complete, readable) owner file
    heartbeat_age: float  # seconds, by the device's clock; a heartbeat in its future counts as old
    token: str = ""  # what the device reads as the token, even of an unreadable owner file
