"""What a sync resolves and records: the lock, the worktree's state, the result of a sync."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kzbuild import __version__
from kzbuild.model.recipe import Recipe

LOCK_FORMAT = 1


@dataclass(frozen=True)
class AppliedPatch:
    file: str
    sha256: str
    commit: str | None  # None when skipped as upstreamed
    upstreamed: str | None = None  # the proof, when the pin already holds the patch

    def to_dict(self) -> dict[str, str | None]:
        data = asdict(self)
        if self.upstreamed is None:
            del data["upstreamed"]
        return data


@dataclass(frozen=True)
class Lock:
    """What a sync resolved. Serialised with sorted keys so equal syncs give equal bytes."""

    recipe: str
    upstream_commit: str
    upstream_tree: str
    fetched_from: str
    patches: tuple[AppliedPatch, ...]
    overlay_digest: str
    overlay_commit: str | None
    head: str
    kzbuild_version: str = __version__

    def inputs(self) -> dict[str, object]:
        """The part that decides whether a sync has anything to do."""
        return {
            "upstream": self.upstream_commit,
            "patches": [(p.file, p.sha256) for p in self.patches],
            "overlays": self.overlay_digest,
            "kzbuild": self.kzbuild_version,
        }

    def commits(self) -> set[str]:
        made = {p.commit for p in self.patches if p.commit}
        if self.overlay_commit:
            made.add(self.overlay_commit)
        return made

    def to_json(self) -> str:
        data = {
            "format": LOCK_FORMAT,
            "recipe": self.recipe,
            "upstream": {
                "commit": self.upstream_commit,
                "tree": self.upstream_tree,
                "fetched_from": self.fetched_from,
            },
            "patches": [p.to_dict() for p in self.patches],
            "overlays": {"digest": self.overlay_digest, "commit": self.overlay_commit},
            "head": self.head,
            "kzbuild_version": self.kzbuild_version,
        }
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Lock:
        data = json.loads(text)
        return cls(
            recipe=data["recipe"],
            upstream_commit=data["upstream"]["commit"],
            upstream_tree=data["upstream"]["tree"],
            fetched_from=data["upstream"]["fetched_from"],
            patches=tuple(AppliedPatch(**p) for p in data["patches"]),
            overlay_digest=data["overlays"]["digest"],
            overlay_commit=data["overlays"]["commit"],
            head=data["head"],
            kzbuild_version=data["kzbuild_version"],
        )


@dataclass(frozen=True)
class SyncInProgress:
    """Written before sync touches the tree, removed when it finishes: a sync killed halfway leaves
    it."""

    pin: str


@dataclass(frozen=True)
class SyncRecord:
    """The state file: the commits whose content is in patches/, and the sync in progress if any."""

    commits: frozenset[str] = frozenset()
    in_progress: SyncInProgress | None = None


@dataclass(frozen=True)
class WorktreeState:
    path: Path
    exists: bool
    head: str | None = None
    base: str | None = None  # refs/kz/base
    dirty: tuple[str, ...] = ()  # porcelain status lines
    unexported: tuple[str, ...] = ()  # "sha subject" of commits sync did not make
    interrupted: SyncInProgress | None = None  # a sync died here; the changes it left are its own
    am_in_progress: bool = False  # .git/rebase-apply: a git am (or rebase --apply) stopped halfway

    @property
    def word(self) -> str:
        """One word (or three) for the state, as `kzbuild status` shows it."""
        if not self.exists:
            return "missing"
        if self.unexported:
            return "unexported commits"
        if self.interrupted:
            return "interrupted sync"
        if self.am_in_progress:
            return "git am in progress"
        return "dirty" if self.dirty else "clean"

    @property
    def clean(self) -> bool:
        return (
            self.exists
            and not self.dirty
            and not self.unexported
            and not self.interrupted
            and not self.am_in_progress
        )

    @property
    def user_changes(self) -> tuple[str, ...]:
        """Uncommitted changes that are the user's: an interrupted sync's leftovers are its own."""
        return () if self.interrupted else self.dirty

    @property
    def user_am(self) -> bool:
        """A git am the user stopped halfway (not the one an interrupted sync left)."""
        return self.am_in_progress and not self.interrupted

    @property
    def at_risk(self) -> bool:
        """Whether replacing the tree would lose work that is not sync's own."""
        return bool(self.unexported or self.user_changes or self.user_am)


@dataclass(frozen=True)
class Discarded:
    """What a forced sync took out of the worktree, all kept under ``ref``."""

    ref: str
    snapshot: (
        bool  # the ref is a commit of the files on top of the old HEAD (else the old HEAD itself)
    )
    changes: tuple[str, ...]  # porcelain lines: uncommitted changes and untracked files
    ignored: tuple[str, ...]  # git-ignored files where the new tree had to write
    commits: tuple[str, ...]  # "sha subject" of commits that were not in patches/

    @property
    def commits_ref(self) -> str:
        return f"{self.ref}^" if self.snapshot else self.ref


@dataclass(frozen=True)
class SyncResult:
    recipe: Recipe
    worktree: Path
    lock: Lock
    changed: bool
    fetched_from: str | None  # None when the cache already had the pin
    notes: tuple[str, ...] = field(default=())
    discarded: Discarded | None = None  # what --force took out (recoverable), None when nothing
    interrupted: SyncInProgress | None = None  # the killed sync this one picked up


@dataclass(frozen=True)
class Status:
    recipe: Recipe
    lock: Lock | None
    worktree: WorktreeState
    matches_lock: bool

    def to_dict(self) -> dict[str, object]:
        wt = self.worktree
        return {
            "recipe": self.recipe.name,
            "pin": self.recipe.upstream.commit,
            "source": self.lock.fetched_from if self.lock else None,
            "patches": [asdict(p) for p in self.lock.patches] if self.lock else [],
            "worktree": {
                "path": str(wt.path),
                "exists": wt.exists,
                "head": wt.head,
                "state": wt.word,
                "dirty": list(wt.dirty),
                "unexported": list(wt.unexported),
                "interrupted": asdict(wt.interrupted) if wt.interrupted else None,
            },
            "matches_lock": self.matches_lock,
        }
