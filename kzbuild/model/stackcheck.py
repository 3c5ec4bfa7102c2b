"""What checking the stack against upstream finds (per patch, per stack, per bisect), and the
results of exporting, bumping and upstream-checking it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from kzbuild.model.recipe import Recipe, Source
from kzbuild.model.sync import SyncResult


@dataclass(frozen=True)
class BumpPlan:
    recipe: Recipe
    target: Target
    check: StackCheck
    bisects: tuple[BisectResult, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def old(self) -> str:
        return self.recipe.upstream.commit

    def to_dict(self) -> dict[str, object]:
        return {
            "recipe": self.recipe.name,
            "old": self.old,
            "new": self.target.commit,
            "to": self.target.label,
            **self.check.to_dict(),
            "bisect": [b.to_dict() for b in self.bisects],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class BumpWritten:
    recipe: Path
    dropped: tuple[str, ...]
    sync: SyncResult
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Target:
    """An upstream commit to check or bump to, and where to fetch it from."""

    commit: str
    sources: tuple[Source, ...]
    label: str  # what the user asked for
    sdist: str | None = None  # "package==version" when the target came from an sdist


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
    fuzz_context: int | None = (
        None  # 3way, conflict: it would apply as a plain patch with this much context
    )
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
                parts.append(
                    f"it would apply with fuzz (context reduced to {self.fuzz_context} lines), "
                    "which git am never does"
                )
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
            "proof": None
            if self.proof is None
            else {
                "kind": self.proof.kind,
                "commit": self.proof.commit,
                "detail": self.proof.detail,
            },
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


class StepStatus(str, Enum):
    PASSED = "pass"
    FAILED = "fail"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class UpstreamStep:
    """One check of ``kzbuild patches upstream``: the patch applied alone at a commit, or built for
    the host."""

    kind: str  # "apply", "build" (for one target) or "compile" (touched files no build compiled)
    label: str  # what was checked, as a verb phrase: "apply alone at the pin 0c1e57098..."
    status: StepStatus
    # apply: the files that do not apply; build: the touched files it compiled; compile: none did
    files: tuple[str, ...] = ()
    detail: str = (
        ""  # apply: git's errors; build: the compiler's last lines and the log; skipped: why
    )

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "label": self.label,
            "status": self.status.value,
            "files": list(self.files),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class UpstreamCheck:
    """A patch as upstream would receive it (kzbuild's trailers stripped), and whether it stands
    alone."""

    patch: str
    text: str  # the stripped mbox
    steps: tuple[UpstreamStep, ...]

    @property
    def first_failure(self) -> UpstreamStep | None:
        return next((s for s in self.steps if s.status is StepStatus.FAILED), None)

    def to_dict(self) -> dict[str, object]:
        return {
            "patch": self.patch,
            "text": self.text,
            "steps": [s.to_dict() for s in self.steps],
            "ok": self.first_failure is None,
        }
