"""``kzbuild sync`` and ``kzbuild status``: a reproducible patched source tree per recipe.

The worktree (``.kz/src/<recipe>``) is a small git repo that borrows its objects from the
shared cache (``objects/info/alternates``). Sync checks out the pin, applies the series one
patch at a time with ``git am --3way`` (a fixed committer and the author's dates, so the
patched commit SHAs are the same on every machine), then commits the kernel overlays, and
writes the recipe's lock. A sync whose inputs match the lock and the worktree does nothing.

Sync never loses work: uncommitted changes, untracked files, commits that sync did not make,
and git-ignored files standing where the new tree must write block it unless ``force`` is
given; ``force`` first keeps all of them under ``refs/kz/discarded/<UTC time>``. Other ignored
files (build dirs, models) are left alone. The state file records a sync in progress and each
commit it makes, so a sync killed halfway is picked up by the next one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import tempfile
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from kzbuild import __version__
from kzbuild.adapters.filelock import locked
from kzbuild.adapters.files import sha256_file, write_atomic
from kzbuild.adapters.gitcmd import KZ_AUTHOR, KZ_EMAIL, Git
from kzbuild.adapters.proc import Progress
from kzbuild.adapters.settings import Settings
from kzbuild.errors import PatchError, WorktreeError
from kzbuild.model.recipe import Recipe
from kzbuild.model.sync import (
    AppliedPatch,
    Discarded,
    Lock,
    Status,
    SyncInProgress,
    SyncRecord,
    SyncResult,
    WorktreeState,
)
from kzbuild.source.sources import ObjectCache
from kzbuild.source.stack.series import read_series

log = logging.getLogger(__name__)

BASE_REF = "refs/kz/base"
DISCARDED_REFS = "refs/kz/discarded/"  # + UTC time: what a forced sync took out of the worktree
STATE_FILE = "kz-sync.json"  # inside the worktree's .git: what the last sync made


def read_lock(path: Path) -> Lock | None:
    try:
        return Lock.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (KeyError, ValueError, TypeError) as exc:
        log.warning("ignoring unreadable lock %s: %s", path, exc)
        return None


@dataclass(frozen=True)
class Inputs:
    """Everything a sync reads, digested, before any git work."""

    recipe: Recipe
    patches: tuple[tuple[str, Path, str], ...]  # (series name, path, sha256)
    overlay_digest: str

    @classmethod
    def of(cls, recipe: Recipe) -> Inputs:
        series = read_series(recipe.series)
        patches = tuple((e.name, e.path, sha256_file(e.path)) for e in series.entries)
        overlay = hashlib.sha256()
        for item in sorted(recipe.overlays, key=lambda o: o.dest):
            overlay.update(f"{item.dest}\0{sha256_file(item.src)}\n".encode())
        return cls(recipe, patches, overlay.hexdigest())

    def matches(self, lock: Lock) -> bool:
        return lock.inputs() == {
            "upstream": self.recipe.upstream.commit,
            "patches": [(name, digest) for name, _, digest in self.patches],
            "overlays": self.overlay_digest,
            "kzbuild": __version__,
        }


def inputs_match(recipe: Recipe, lock: Lock | None) -> bool:
    """The recipe's pin, patches and overlays are what ``lock`` was synced from."""
    return lock is not None and Inputs.of(recipe).matches(lock)


class Worktree:
    """A recipe's patched source tree."""

    def __init__(self, settings: Settings, recipe: Recipe, *, path: Path | None = None) -> None:
        self.settings = settings
        self.recipe = recipe
        self.path = path or settings.worktree(
            recipe.name
        )  # another path: a scratch repo for checks
        self.git = Git(self.path)

    def lock(self, *, shared: bool = False, wait: float = 10.0) -> AbstractContextManager[None]:
        """Exclusive for sync; shared for readers (builds) that need the tree to hold still."""
        key = hashlib.sha256(str(self.path).encode()).hexdigest()[:16]
        return locked(
            self.settings.locks / f"worktree-{key}.lock",
            what=f"the worktree {self.path}",
            shared=shared,
            wait=wait,
        )

    @property
    def state_file(self) -> Path:
        return self.path / ".git" / STATE_FILE

    def read_record(self) -> SyncRecord:
        try:
            data = json.loads(self.state_file.read_text())
            progress = data.get("in_progress")
            return SyncRecord(
                frozenset(data["commits"]), SyncInProgress(progress["pin"]) if progress else None
            )
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return SyncRecord()

    def made_by_sync(self) -> set[str]:
        """Commits whose content is in patches/ (made by sync, or exported since)."""
        return set(self.read_record().commits)

    def save_state(self, commits: set[str], in_progress: SyncInProgress | None = None) -> None:
        data: dict[str, object] = {"commits": sorted(commits)}
        if in_progress:
            data["in_progress"] = asdict(in_progress)
        # Atomic: a sync killed while writing must not leave a record that reads as empty.
        write_atomic(self.state_file, (json.dumps(data) + "\n").encode())

    def state(self) -> WorktreeState:
        if not (self.path / ".git").is_dir():
            return WorktreeState(self.path, exists=False)
        head, base = self.git.resolve_all("HEAD", BASE_REF)
        record = self.read_record()
        dirty = tuple(
            line
            for line in self.git("status", "--porcelain", "--untracked-files=all").splitlines()
            if line
        )
        # A HEAD that a finished sync (or export) recorded has only recorded commits above the base.
        settled = head in record.commits and record.in_progress is None
        unexported = self.unexported_commits(head, base, record) if head and not settled else ()
        am_in_progress = (self.path / ".git" / "rebase-apply").exists()
        return WorktreeState(
            self.path, True, head, base, dirty, unexported, record.in_progress, am_in_progress
        )

    def unexported_commits(
        self, head: str, base: str | None, record: SyncRecord
    ) -> tuple[str, ...]:
        """``sha subject`` of the commits above the base that sync did not make, oldest first."""
        base = base or self.fallback_base(head)
        revs = (
            f"{base}..{head}" if base else head
        )  # no base at all: every commit sync did not make counts
        lines = self.git("log", "--reverse", "--format=%H %ce %s", revs).splitlines()
        # git am commits before sync can record the commit: an interrupted sync owns one
        # more commit by kzbuild.
        pending = record.in_progress is not None
        unexported = []
        for line in lines:
            sha, committer, subject = (line.split(" ", 2) + [""])[:3]
            if sha in record.commits:
                continue
            if pending and committer == KZ_EMAIL:
                pending = False
                continue
            unexported.append(f"{sha} {subject}")
        return tuple(unexported)

    def fallback_base(self, head: str) -> str | None:
        """Without refs/kz/base: the locked upstream commit or the pin, whichever HEAD descends
        from."""
        lock = read_lock(self.recipe.lock_path)
        for candidate in (lock.upstream_commit if lock else None, self.recipe.upstream.commit):
            if (
                candidate
                and self.git.run("merge-base", "--is-ancestor", candidate, head, check=False).ok
            ):
                return candidate
        return None

    def ignored_in_the_way(self, pin: str, inputs: Inputs) -> tuple[str, ...]:
        """Git-ignored files at a path the pin, a patch or an overlay writes (or needs as a
        directory)."""
        ignored = self.git("ls-files", "-z", "--others", "--ignored", "--exclude-standard").split(
            "\0"
        )
        ignored = [path for path in ignored if path]
        if not ignored:
            return ()
        from kzbuild.source.stack.patchfile import read_patch  # see apply_series

        needed = set(self.git("ls-tree", "-r", "-z", "--name-only", pin).split("\0"))
        needed |= {
            change.path
            for name, path, _ in inputs.patches
            for change in read_patch(path, name).files
        }
        needed |= {overlay.dest for overlay in self.recipe.overlays}
        needed_dirs = {parent for path in needed for parent in parent_dirs(path)}
        return tuple(
            path
            for path in ignored
            if path in needed
            or path in needed_dirs
            or any(parent in needed for parent in parent_dirs(path))
        )

    def discard(self, state: WorktreeState, in_the_way: tuple[str, ...]) -> Discarded | None:
        """Keep what a forced sync replaces under a refs/kz/discarded/ ref: the old HEAD, and the
        uncommitted files as a commit on top of it (made with a temporary index)."""
        changes = state.user_changes
        if not (state.unexported or changes or in_the_way):
            return None
        tip = state.head
        if changes or in_the_way:
            with tempfile.TemporaryDirectory() as scratch:
                index = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
                self.git("read-tree", *([state.head] if state.head else ["--empty"]), env=index)
                self.git("add", "-A", env=index)
                if in_the_way:
                    self.git(
                        "add",
                        "-f",
                        "--pathspec-from-file=-",
                        "--pathspec-file-nul",
                        env=index,
                        input="\0".join(in_the_way),
                    )
                tree = self.git("write-tree", env=index)
            parents = ["-p", state.head] if state.head else []
            tip = self.git(
                "commit-tree",
                tree,
                *parents,
                "-m",
                "kz: files discarded by sync --force",
                env=KZ_AUTHOR,
            )
        assert tip is not None  # no HEAD means no commits; then there were files to snapshot
        ref = DISCARDED_REFS + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        self.git("update-ref", ref, tip)
        for path in in_the_way:  # kept in the snapshot; git am would refuse to overwrite them
            (self.path / path).unlink()
        return Discarded(ref, tip != state.head, changes, in_the_way, state.unexported)

    def remove_stale_git_locks(self) -> None:
        """The lock files of a git that a killed sync took down with it (git refuses to run while
        they exist).
        Only called when the state file says a sync was killed here, with the worktree lock held."""
        dot_git = self.path / ".git"
        for stale in [*dot_git.glob("*.lock"), *(dot_git / "refs").rglob("*.lock")]:
            log.warning("removing %s, left by an interrupted sync", stale)
            stale.unlink()

    def create(self, cache: ObjectCache) -> None:
        """An empty repo whose objects come from the shared cache."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q")
        alternates = self.path / ".git" / "objects" / "info" / "alternates"
        alternates.parent.mkdir(parents=True, exist_ok=True)
        alternates.write_text(str(cache.path / "objects") + "\n")

    def share_shallow(self, cache: ObjectCache) -> None:
        """The cache is shallow; tell this repo where history stops, or git walks into missing
        parents."""
        commits = cache.shallow_commits()
        shallow = self.path / ".git" / "shallow"
        if commits:
            shallow.write_text("\n".join(commits) + "\n")
        elif shallow.exists():
            shallow.unlink()


def parent_dirs(path: str) -> list[str]:
    """``a`` and ``a/b`` for ``a/b/c``."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def check_no_lost_work(state: WorktreeState, *, what: str, recipe: str) -> None:
    if not state.exists or not state.at_risk:
        return
    lines = []
    if state.user_changes:
        lines.append("uncommitted changes:")
        lines += [f"  {line}" for line in state.user_changes[:20]]
    if state.unexported:
        lines.append("commits that are not in patches/:")
        lines += [f"  {line}" for line in state.unexported[:20]]
    if state.user_am:
        lines.append(
            f"a git am in progress (.git/rebase-apply): finish it (git -C {state.path} am "
            "--continue) or abort it"
        )
    raise WorktreeError(
        f"{what} would lose work in {state.path}:\n" + "\n".join(lines),
        hint=f"keep it: commit it (git -C {state.path} commit -a) and run 'kzbuild patches export "
        f"{recipe}'; "
        f"or discard it: 'kzbuild sync {recipe} --force' (keeps it under {DISCARDED_REFS}<time>)",
    )


def check_nothing_in_the_way(path: Path, in_the_way: tuple[str, ...], *, recipe: str) -> None:
    if not in_the_way:
        return
    raise WorktreeError(
        f"sync would overwrite git-ignored files in {path} (the new tree writes at their paths):\n"
        + "\n".join(f"  {name}" for name in in_the_way[:20]),
        hint=f"move them elsewhere; or 'kzbuild sync {recipe} --force' (keeps them under "
        f"{DISCARDED_REFS}<time>)",
    )


def sync(
    settings: Settings, recipe: Recipe, *, force: bool = False, progress: Progress | None = None
) -> SyncResult:
    inputs = Inputs.of(recipe)
    worktree = Worktree(settings, recipe)
    with worktree.lock():
        lock = read_lock(recipe.lock_path)
        state = worktree.state()
        if (
            lock
            and inputs.matches(lock)
            and state.clean
            and state.head == lock.head
            and state.base == lock.upstream_commit
        ):
            return SyncResult(recipe, worktree.path, lock, changed=False, fetched_from=None)
        if not force:
            check_no_lost_work(state, what="sync", recipe=recipe.name)

        cache = ObjectCache(settings)
        pin = recipe.upstream.commit
        fetched = cache.ensure(pin, recipe.upstream.sources, progress=progress)
        if not state.exists:
            worktree.create(cache)
        worktree.share_shallow(cache)
        if state.interrupted:
            worktree.remove_stale_git_locks()
        in_the_way = worktree.ignored_in_the_way(pin, inputs) if state.exists else ()
        if not force:
            check_nothing_in_the_way(worktree.path, in_the_way, recipe=recipe.name)
        discarded = worktree.discard(state, in_the_way) if force else None

        git = worktree.git
        in_progress = SyncInProgress(pin)
        worktree.save_state(worktree.made_by_sync(), in_progress)
        if state.am_in_progress:
            git(
                "am", "--quit"
            )  # left by a killed sync (or forced); the checkout below replaces what it did
        git(
            "clean", "-q", "-fd"
        )  # before the checkout, so the ignore rules are the ones the user had
        git("update-ref", BASE_REF, pin)
        git("checkout", "-q", "-f", "-B", recipe.branch, pin)

        applied = apply_series(worktree, inputs, in_progress)
        overlay_commit = commit_overlays(worktree, pin)

        fetched_from = fetched.source or (
            lock.fetched_from if lock and lock.upstream_commit == pin else "cache"
        )
        new_lock = Lock(
            recipe=recipe.name,
            upstream_commit=pin,
            upstream_tree=fetched.tree,
            fetched_from=fetched_from,
            patches=tuple(applied),
            overlay_digest=inputs.overlay_digest,
            overlay_commit=overlay_commit,
            head=git.resolve("HEAD") or "",
        )
        worktree.save_state(new_lock.commits())
        recipe.lock_path.write_text(new_lock.to_json(), encoding="utf-8")
        notes = tuple(
            f"skipped {p.file}: upstreamed ({p.upstreamed})" for p in applied if p.upstreamed
        )
        return SyncResult(
            recipe,
            worktree.path,
            new_lock,
            changed=True,
            fetched_from=fetched.source,
            notes=notes,
            discarded=discarded,
            interrupted=state.interrupted,
        )


def apply_series(
    worktree: Worktree, inputs: Inputs, in_progress: SyncInProgress
) -> list[AppliedPatch]:
    """Apply each patch as one commit, skipping the ones the pin already holds; on failure abort and
    report.
    Each commit is recorded as made, so a sync killed halfway owns the commits it left."""
    # Imported here: patch parsing and classification cost every kzbuild start (and the no-op
    # sync) ~40 ms.
    from kzbuild.source.stack.apply import find_upstreamed
    from kzbuild.source.stack.patchfile import read_patch

    applied: list[AppliedPatch] = []
    pin = inputs.recipe.upstream.commit
    for name, path, digest in inputs.patches:
        proof = find_upstreamed(worktree.git, read_patch(path, name), pin)
        if proof is not None:
            log.info("skipping %s: upstreamed at %s (%s)", name, pin[:12], proof.describe())
            applied.append(
                AppliedPatch(file=name, sha256=digest, commit=None, upstreamed=proof.describe())
            )
            continue
        result = worktree.git.run(
            "am",
            "--3way",
            "--keep-non-patch",
            "--committer-date-is-author-date",
            str(path),
            check=False,
        )
        if not result.ok:
            failure = describe_am_failure(result.stdout + result.stderr)
            worktree.git.run("am", "--abort", check=False)
            # The patches applied so far are sync's own commits, not local work to protect.
            worktree.save_state({p.commit for p in applied if p.commit})
            raise PatchError(
                f"patch {name} does not apply to upstream {pin[:12]}"
                + (f" (after {applied[-1].file})" if applied else "")
                + ":\n  "
                + "\n  ".join(failure or ["git am gave no detail"]),
                hint=f"the worktree {worktree.path} is left at the last patch that applied; "
                "rebase the patch there, then 'kzbuild patches export'",
            )
        applied.append(
            AppliedPatch(file=name, sha256=digest, commit=worktree.git("rev-parse", "HEAD"))
        )
        worktree.save_state({p.commit for p in applied if p.commit}, in_progress)
    return applied


AM_DETAIL = re.compile(
    r"^(error: patch failed: .*|error: .*: patch does not apply|CONFLICT .*|error: .*does not "
    r"exist in index)$"
)


def describe_am_failure(output: str) -> list[str]:
    """The lines of git am's output that name the failing files and hunks."""
    return [line for line in output.splitlines() if AM_DETAIL.match(line.strip())]


def commit_overlays(worktree: Worktree, pin: str) -> str | None:
    """Copy the recipe's overlays into the tree and commit them (dated like the pin, for
    reproducibility)."""
    recipe = worktree.recipe
    if not recipe.overlays:
        return None
    for overlay in recipe.overlays:
        target = worktree.path / overlay.dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(overlay.src, target)
        worktree.git("add", "-f", "--", overlay.dest)
    if worktree.git.run("diff", "--cached", "--quiet", check=False).ok:
        return None
    date = worktree.git.commit_date(pin)
    listing = "\n".join(
        f"{o.dest} <- {o.src.relative_to(worktree.settings.project).as_posix()}"
        for o in recipe.overlays
    )
    worktree.git(
        "commit",
        "-q",
        "--no-verify",
        "-m",
        f"kz: kernel overlays for {recipe.name}\n\n{listing}",
        env={**KZ_AUTHOR, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
    )
    return worktree.git("rev-parse", "HEAD")


def status(settings: Settings, recipe: Recipe) -> Status:
    lock = read_lock(recipe.lock_path)
    state = Worktree(settings, recipe).state()
    matches = bool(
        lock
        and inputs_match(recipe, lock)
        and state.head == lock.head
        and state.base == lock.upstream_commit
    )
    return Status(recipe, lock, state, matches)
