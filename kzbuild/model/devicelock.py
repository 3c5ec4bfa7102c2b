"""The owner record of a device lock (``ROOT/.lock/owner`` on the device)."""

from __future__ import annotations

from dataclasses import dataclass

OWNER_FIELDS = 5  # one per line: host, pid, since, operation, token


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
        """The owner from the owner file's lines; None when they are missing or garbled."""
        if len(lines) < OWNER_FIELDS or not lines[1].isdigit() or not lines[4]:
            return None
        host, pid, since, operation, token = lines[:OWNER_FIELDS]
        return cls(host, int(pid), since, operation, token)

    def describe(self) -> str:
        return f"{self.operation} by {self.host} pid {self.pid} since {self.since}"


@dataclass(frozen=True)
class LockSighting:
    """A held lock as a contender saw it: who holds it and how long since its heartbeat."""

    owner: LockOwner | None  # None: the lock dir has no (complete) owner file
    heartbeat_age: float  # seconds, by the device's clock
