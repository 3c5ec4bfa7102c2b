"""The patch stack: the series file, the patches it names, and what checks found about them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

# The trailer vocabulary every patch carries (see patches/README.md).
UPSTREAM_STATUS = "Upstream-Status"
UPSTREAM_PR = "Upstream-PR"
DROP_WHEN = "Drop-When"
KZ_TEST = "Kz-Test"
KZ_TRAILERS = (UPSTREAM_STATUS, UPSTREAM_PR, DROP_WHEN, KZ_TEST)
REQUIRED_TRAILERS = (UPSTREAM_STATUS, KZ_TEST)
# Upstream-Status kinds and what follows the kind word.
STATUS_KINDS = {
    "Pending": "nothing",
    "Submitted": "url",
    "Backport": "sha-or-url",
    "Inappropriate": "text",
    "Merged": "sha",
}


@dataclass(frozen=True)
class SeriesEntry:
    name: str  # file name as written in the series, relative to the series' folder
    path: Path  # absolute path of the patch file
    line: int  # line in the series file


@dataclass(frozen=True)
class Series:
    path: Path
    entries: tuple[SeriesEntry, ...]

    @property
    def directory(self) -> Path:
        return self.path.parent

    def names(self) -> list[str]:
        return [entry.name for entry in self.entries]

    def entry(self, name: str) -> SeriesEntry | None:
        return next((e for e in self.entries if e.name == name), None)


@dataclass(frozen=True)
class Problem:
    """One lint finding: a file, a line in it (when known) and what is wrong."""

    path: Path
    line: int | None
    message: str

    def where(self, root: Path | None = None) -> str:
        shown = self.path
        if root is not None and self.path.is_relative_to(root):
            shown = self.path.relative_to(root)
        return f"{shown}:{self.line}" if self.line else str(shown)


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


class Verdict(str, Enum):
    """How a patch fares against an upstream commit (``kzbuild patches check``)."""

    CLEAN = "clean"
    THREE_WAY = "3way"
    CONFLICT = "conflict"
    UPSTREAMED = "upstreamed"
    EMPTY = "empty"


@dataclass(frozen=True)
class Proof:
    """Why a patch is considered upstreamed."""

    kind: str  # "patch-id", "reverse-apply", "drop-when" or "merged"
    commit: str | None  # the upstream commit that carries the change, when one is known
    detail: str

    def describe(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class PatchCheck:
    name: str
    verdict: Verdict
    files: tuple[str, ...] = ()  # 3way: files merged; conflict: files that conflict
    hunks: tuple[str, ...] = ()  # 3way and conflict: the hunks that do not apply as written
    lines: tuple[int, ...] = ()  # lines of those hunks' @@ headers in the patch file
    fuzz_context: int | None = None  # 3way, conflict: it would apply as a plain patch with this much context
    proof: Proof | None = None
    note: str = ""

    def describe(self) -> str:
        if self.verdict is Verdict.UPSTREAMED and self.proof:
            return self.proof.describe()
        parts = []
        if self.verdict is Verdict.THREE_WAY and self.files:
            parts.append("3-way merged " + ", ".join(self.files))
        if self.verdict is Verdict.CONFLICT:
            parts.append("; ".join(self.hunks) if self.hunks else ", ".join(self.files))
            if self.fuzz_context is not None:
                parts.append(f"it would apply with fuzz (context reduced to {self.fuzz_context} lines), which git am never does")
        if self.note:
            parts.append(self.note)
        return "; ".join(p for p in parts if p)

    def to_dict(self) -> dict[str, object]:
        return {
            "patch": self.name,
            "verdict": self.verdict.value,
            "files": list(self.files),
            "hunks": list(self.hunks),
            "fuzz_context": self.fuzz_context,
            "proof": None if self.proof is None else {"kind": self.proof.kind, "commit": self.proof.commit, "detail": self.proof.detail},
            "note": self.note,
        }


@dataclass(frozen=True)
class StackCheck:
    """The whole series checked against one upstream commit."""

    target: str
    since: str | None  # the commit the patch-id search starts from (the current pin), if any
    history: str  # how much upstream history between ``since`` and ``target`` the cache holds
    commits_between: int | None  # None when history is missing
    patches: tuple[PatchCheck, ...]
    notes: tuple[str, ...] = ()

    @property
    def conflicts(self) -> tuple[PatchCheck, ...]:
        return tuple(p for p in self.patches if p.verdict is Verdict.CONFLICT)

    @property
    def upstreamed(self) -> tuple[PatchCheck, ...]:
        return tuple(p for p in self.patches if p.verdict is Verdict.UPSTREAMED)

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "since": self.since,
            "history": self.history,
            "commits_between": self.commits_between,
            "patches": [p.to_dict() for p in self.patches],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class UpstreamCommit:
    sha: str
    subject: str
    author: str
    date: str

    def to_dict(self) -> dict[str, str]:
        return {"sha": self.sha, "subject": self.subject, "author": self.author, "date": self.date}


@dataclass(frozen=True)
class BisectResult:
    """The first upstream commit at which a patch stops applying, or why it could not be found."""

    patch: str
    culprit: UpstreamCommit | None
    checks: int  # apply checks run
    commits: int  # upstream commits in the bisected range
    reason: str | None = None  # why there is no culprit (history missing, ...)

    def to_dict(self) -> dict[str, object]:
        return {
            "patch": self.patch,
            "culprit": self.culprit.to_dict() if self.culprit else None,
            "apply_checks": self.checks,
            "commits": self.commits,
            "reason": self.reason,
        }


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


@dataclass(frozen=True)
class ExportResult:
    written: tuple[str, ...] = ()  # patches whose file was (re)written
    normalized: tuple[str, ...] = ()  # of those, the ones whose change was format only
    added: tuple[str, ...] = ()  # new patches (from commits with no file yet)
    removed: tuple[str, ...] = ()  # patches whose commit is gone
    unchanged: tuple[str, ...] = ()
    series_changed: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return bool(self.written or self.added or self.removed or self.series_changed)
