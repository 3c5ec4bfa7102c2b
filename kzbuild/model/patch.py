"""A patch file of the stack: its mail headers, trailers and diff; the log of dropped patches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kzbuild.model.stack import Problem

# The trailer vocabulary every patch carries (see patches/README.md).
UPSTREAM_STATUS = "Upstream-Status"
UPSTREAM_PR = "Upstream-PR"
DROP_WHEN = "Drop-When"
KZ_TEST = "Kz-Test"
KZ_EXPECT = "Kz-Expect"  # an effect kzbuild ab checks: "pp512 +10% on pad3"
# a check kzbuild check runs on a device: "test-backend-ops -o GATED_DELTA_NET -b HTP0"
KZ_DEVICE_TEST = "Kz-Device-Test"
KZ_TRAILERS = (UPSTREAM_STATUS, UPSTREAM_PR, DROP_WHEN, KZ_TEST, KZ_EXPECT, KZ_DEVICE_TEST)
REQUIRED_TRAILERS = (UPSTREAM_STATUS, KZ_TEST)
REPEATABLE_TRAILERS = (KZ_EXPECT, KZ_DEVICE_TEST)  # one per metric and device; one per device check
# Upstream-Status kinds and what follows the kind word.
STATUS_KINDS = {
    "Pending": "nothing",
    "Submitted": "url",
    "Backport": "sha-or-url",
    "Inappropriate": "text",
    "Merged": "sha",
}


@dataclass(frozen=True)
class Expectation:
    """A patch's declared effect (``Kz-Expect: pp512 +10% on pad3``): the full stack against the
    stack without it."""

    patch: str  # series name
    metric: str  # a llama-bench test name: pp512, tg64, pp512+tg128, pp512@d4096
    pct: float  # expected change in percent, never 0
    device: str  # the device name it holds on
    line: int  # of the trailer in the patch file

    def describe(self) -> str:
        return f"{self.metric} {self.pct:+g}% on {self.device}"


@dataclass(frozen=True)
class Trailer:
    key: str
    value: str
    line: int  # line in the patch file


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    line: int  # line of the @@ header in the patch file
    end: int  # last line of the hunk in the patch file
    added: tuple[str, ...]  # the + lines, without the marker
    removed: tuple[str, ...]  # the - lines, without the marker

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"


@dataclass(frozen=True)
class FileChange:
    path: str  # path after the change (before it, for a deletion)
    old_path: str | None  # the source of a rename or copy
    line: int  # line of the "diff --git" header
    index_line: int | None  # line of the "index" header
    full_index: bool  # the index line names full 40-hex blob ids
    preimage: str | None  # the blob the change was made against (full index, not a new file)
    binary: bool
    hunks: tuple[Hunk, ...]

    @property
    def added(self) -> int:
        return sum(len(h.added) for h in self.hunks)

    @property
    def removed(self) -> int:
        return sum(len(h.removed) for h in self.hunks)


@dataclass(frozen=True)
class Patch:
    """A ``git format-patch`` file, parsed. ``problems`` lists what makes it malformed."""

    name: str
    path: Path
    author: str
    date: str
    subject: str
    body: str  # the message after the subject, trailers included
    trailers: tuple[Trailer, ...]
    files: tuple[FileChange, ...]
    problems: tuple[Problem, ...] = ()

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed for f in self.files)

    def trailer(self, key: str) -> str | None:
        found = next((t for t in self.trailers if t.key == key), None)
        return found.value if found else None

    @property
    def upstream_status(self) -> str | None:
        return self.trailer(UPSTREAM_STATUS)

    @property
    def status_kind(self) -> str | None:
        value = self.upstream_status
        return value.split(None, 1)[0] if value else None

    @property
    def merged_commit(self) -> str | None:
        """The upstream sha of a ``Merged <sha>`` status."""
        kind, _, rest = (self.upstream_status or "").partition(" ")
        if kind != "Merged":
            return None
        return rest.strip() or None

    @property
    def drop_when(self) -> str | None:
        return self.trailer(DROP_WHEN)


@dataclass(frozen=True)
class DropRecord:
    """One entry of the committed log of dropped patches (``patches/DROPPED.yaml``)."""

    patch: str
    subject: str
    date: str  # ISO date
    reason: str
    upstream: str | None = None  # the upstream commit that made it obsolete, when known
    upstream_status: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {
            "patch": self.patch,
            "subject": self.subject,
            "date": self.date,
            "reason": self.reason,
            "upstream": self.upstream,
            "upstream_status": self.upstream_status,
        }
