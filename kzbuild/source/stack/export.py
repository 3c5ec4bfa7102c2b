"""``kzbuild patches export`` and ``patches new``: the worktree's commits back to patches/.

Export writes each commit above the base with fixed ``format-patch`` options (no signature,
zero hash in the From line, full index, no diffstat, subject kept, pinned diff algorithm and
rename detection), so exporting an unchanged worktree again rewrites nothing.

A commit keeps the file name of the patch it came from. It is matched, in this order, by
the commit sync made from that file (the lock), by patch-id (the same change, rebased or
reworded), or by subject (the same patch, edited). Commits that match no patch become new
patches named from their subject; patches whose commit is gone leave the series (patches
sync skipped as upstreamed stay: drop those with ``kzbuild patches drop``).

Export refuses to overwrite a patch file that changed since this worktree was synced or
last exported (a teammate's update pulled in meanwhile) unless forced.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from kzbuild.adapters.files import sha256_file, write_atomic
from kzbuild.adapters.gitcmd import KZ_EMAIL, Git
from kzbuild.adapters.settings import Settings
from kzbuild.errors import ConfigError, PatchError, WorktreeError
from kzbuild.model.patch import DROP_WHEN, KZ_TEST, UPSTREAM_PR, UPSTREAM_STATUS, Patch
from kzbuild.model.recipe import Recipe
from kzbuild.model.stack import SeriesEntry
from kzbuild.model.stackcheck import ExportResult
from kzbuild.model.sync import Lock, WorktreeState
from kzbuild.source.stack.apply import patch_id
from kzbuild.source.stack.patchfile import (
    DIFF_OPTIONS,
    parse_patch,
    patch_file_name,
    read_patch,
    trailer_value_problem,
)
from kzbuild.source.stack.series import read_series, reorder_series
from kzbuild.source.sync import Worktree, read_lock

EXPORT_STATE = (
    "kz-export.json"  # inside the worktree's .git: the series as this worktree last wrote it
)
FORMAT_PATCH = (
    "format-patch",
    "--stdout",
    "--no-signature",
    "--zero-commit",
    "--no-stat",
    "--keep-subject",
    "--no-numbered",
    "--no-thread",
    "--no-cover-letter",
    "--no-attach",
    "--encode-email-headers",
    "--no-notes",
    *DIFF_OPTIONS,
)
OVERLAY_SUBJECT = "kz: kernel overlays"
IDENT = re.compile(r"^(.*?) <(.*)>")


@dataclass(frozen=True)
class _Commit:
    sha: str
    subject: str
    text: str  # the normalized patch
    overlay: bool


def export(settings: Settings, recipe: Recipe, *, force: bool = False) -> ExportResult:
    worktree = Worktree(settings, recipe)
    with worktree.lock():
        return _export(worktree, force=force, names={})


def new_patch(
    settings: Settings,
    recipe: Recipe,
    name: str,
    *,
    subject: str,
    test: str,
    upstream_status: str = "Pending",
    upstream_pr: str | None = None,
    drop_when: str | None = None,
    author: str | None = None,
) -> tuple[str, ExportResult]:
    """Commit the worktree's uncommitted changes as a new patch ``name`` and export the stack."""
    name = name if name.endswith(".patch") else f"{name}.patch"
    if "/" in name or name.startswith("."):
        raise ConfigError(f"'{name}' is not a plain file name")
    series = read_series(recipe.series)
    if name in series.names() or (series.directory / name).exists():
        raise ConfigError(
            f"patches/{name} already exists",
            hint="pick another name, or edit that patch's commit in the worktree and export",
        )
    trailers = [(UPSTREAM_STATUS, upstream_status), (KZ_TEST, test)]
    trailers += [
        (key, value) for key, value in ((UPSTREAM_PR, upstream_pr), (DROP_WHEN, drop_when)) if value
    ]
    for key, value in trailers:
        problem = trailer_value_problem(key, value)
        if problem:
            raise ConfigError(problem)
    worktree = Worktree(settings, recipe)
    with worktree.lock():
        state = _exportable_state(worktree, recipe, allow_dirty=True)
        if not state.dirty:
            raise PatchError(
                f"the worktree {worktree.path} has no uncommitted changes to put in {name}",
                hint="edit the files there first; commits you already made are exported by "
                "'kzbuild patches export'",
            )
        author_name, author_email = _author(worktree, author)
        message = f"{subject.strip()}\n\n" + "".join(f"{key}: {value}\n" for key, value in trailers)
        worktree.git("add", "-A")
        worktree.git(
            "commit",
            "-q",
            "--no-verify",
            "-F",
            "-",
            env={
                "GIT_AUTHOR_NAME": author_name,
                "GIT_AUTHOR_EMAIL": author_email,
            },  # committer: kzbuild (gitcmd)
            input=message,
        )
        commit = worktree.git("rev-parse", "HEAD")
        return name, _export(worktree, force=False, names={commit: name})


def _author(worktree: Worktree, given: str | None) -> tuple[str, str]:
    """``Name <email>`` as given, else the user's own git identity (their config, not kzbuild's)."""
    if given is None:
        given = worktree.git.user_ident() or ""
    match = IDENT.match(given or "")
    if not match or not match.group(1).strip() or "@" not in match.group(2):
        raise ConfigError(
            "no author for the new patch",
            hint="pass --author 'Name <email>', or set your git user.name and user.email",
        )
    return match.group(1).strip(), match.group(2).strip()


def _exportable_state(
    worktree: Worktree, recipe: Recipe, *, allow_dirty: bool = False
) -> WorktreeState:
    state = worktree.state()
    if not state.exists:
        raise WorktreeError(
            f"there is no worktree for {recipe.name} at {worktree.path}",
            hint=f"run 'kzbuild sync {recipe.name}' first",
        )
    if state.interrupted:
        # Its commits are part of a series: exporting them would drop the patches it had
        # not applied yet.
        raise WorktreeError(
            f"a sync of {recipe.name} was interrupted in {worktree.path}; the worktree holds part "
            "of the series",
            hint=f"run 'kzbuild sync {recipe.name}' to finish it first",
        )
    if state.dirty and not allow_dirty:
        raise WorktreeError(
            f"the worktree {worktree.path} has uncommitted changes; export writes commits only:\n  "
            + "\n  ".join(state.dirty[:20]),
            hint=f"commit them (git -C {worktree.path} commit -a), or make them a new patch: "
            f"kzbuild patches new NAME {recipe.name}",
        )
    if state.base != recipe.upstream.commit:
        raise WorktreeError(
            f"the worktree is based on upstream {str(state.base)[:12]}, but {recipe.name} pins "
            f"{recipe.upstream.commit[:12]}",
            hint=f"run 'kzbuild sync {recipe.name}' first (it refuses while the worktree holds "
            "unexported work)",
        )
    return state


def _export(worktree: Worktree, *, force: bool, names: dict[str, str]) -> ExportResult:
    recipe = worktree.recipe
    state = _exportable_state(worktree, recipe)
    series = read_series(recipe.series)
    lock = read_lock(recipe.lock_path)
    if lock and lock.upstream_commit != state.base:
        lock = None
    if not force:
        _refuse_stale(worktree, series.entries, lock)
    git = worktree.git
    if git("rev-list", "--merges", f"{state.base}..HEAD"):
        raise PatchError(
            "the worktree's history above the base has merge commits; a patch stack is linear",
            hint="rebase it onto the base first",
        )
    commits = [
        _format(worktree, sha)
        for sha in git("rev-list", "--reverse", f"{state.base}..HEAD").split()
    ]
    patches = {entry.name: read_patch(entry.path, entry.name) for entry in series.entries}
    mapping = _map_commits([c for c in commits if not c.overlay], patches, lock, names, git)

    skipped = {p.file for p in lock.patches if p.upstreamed} if lock else set()
    mapped = set(mapping.values())
    kept = [n for n in series.names() if n in skipped and n not in mapped]
    removed = [n for n in series.names() if n not in mapped and n not in skipped]
    written, normalized, added, unchanged = [], [], [], []
    for commit in (c for c in commits if not c.overlay):
        name = mapping[commit.sha]
        path = series.directory / name
        data = commit.text.encode("utf-8")
        if name not in patches:
            added.append(name)
        elif path.read_bytes() == data:
            unchanged.append(name)
            continue
        elif _same_change(patches[name], commit.text, git):
            normalized.append(name)
        write_atomic(path, data)
        written.append(name)
    for name in removed:
        (series.directory / name).unlink()
    order = _series_order([mapping[c.sha] for c in commits if not c.overlay], kept, series.names())
    series_changed = reorder_series(series.path, order)

    worktree.save_state(worktree.made_by_sync() | {c.sha for c in commits})
    digests = {name: sha256_file(series.directory / name) for name in order}
    (worktree.path / ".git" / EXPORT_STATE).write_text(
        json.dumps({"series": digests}, indent=1, sort_keys=True) + "\n"
    )
    notes = tuple(
        f"kept {n}: sync skipped it as upstreamed; drop it with 'kzbuild patches drop {n} --reason "
        "...'"
        for n in kept
    )
    return ExportResult(
        written=tuple(w for w in written if w not in added),
        normalized=tuple(normalized),
        added=tuple(added),
        removed=tuple(removed),
        unchanged=tuple(unchanged),
        series_changed=series_changed,
        notes=notes,
    )


def _refuse_stale(worktree: Worktree, entries: tuple[SeriesEntry, ...], lock: Lock | None) -> None:
    """Refuse when a patch file differs from every version this worktree knows (synced or
    exported)."""
    known: dict[str, set[str]] = {}
    for applied in lock.patches if lock else ():
        known.setdefault(applied.file, set()).add(applied.sha256)
    try:
        exported = json.loads((worktree.path / ".git" / EXPORT_STATE).read_text())["series"]
    except (FileNotFoundError, ValueError, KeyError):
        exported = {}
    for name, digest in exported.items():
        known.setdefault(name, set()).add(digest)
    stale = [
        entry.name
        for entry in entries
        if sha256_file(entry.path) not in known.get(entry.name, set())
    ]
    if stale:
        raise PatchError(
            "these patches changed since the worktree was synced or exported, and export would "
            "overwrite them:\n  " + "\n  ".join(stale),
            hint=f"to keep their new version, save your commits (git -C {worktree.path} "
            "format-patch refs/kz/base) and "
            f"'kzbuild sync {worktree.recipe.name} --force'; to overwrite them, 'kzbuild patches "
            "export --force'",
        )


def _format(worktree: Worktree, sha: str) -> _Commit:
    git = worktree.git
    email, subject = git("log", "-1", "--format=%ae%x00%s", sha).split("\0", 1)
    text = git.run(*FORMAT_PATCH, "-1", sha).stdout
    return _Commit(
        sha, subject, text, overlay=email == KZ_EMAIL and subject.startswith(OVERLAY_SUBJECT)
    )


def _map_commits(
    commits: list[_Commit],
    patches: dict[str, Patch],
    lock: Lock | None,
    names: dict[str, str],
    git: Git,
) -> dict[str, str]:
    """Commit sha -> patch file name (see the module doc for the order of the rules)."""
    made_from = {p.commit: p.file for p in lock.patches if p.commit} if lock else {}
    by_pid: dict[str, str] = {}
    for name, patch in patches.items():
        pid = patch_id(git, patch.path.read_bytes().decode("utf-8", errors="replace"))
        if pid:
            by_pid.setdefault(pid, name)
    subjects: dict[str, list[str]] = {}
    for name, patch in patches.items():
        subjects.setdefault(patch.subject, []).append(name)
    by_subject = {s: names_[0] for s, names_ in subjects.items() if len(names_) == 1}

    mapping: dict[str, str] = {}
    claimed: set[str] = set()
    pending = []
    for commit in commits:  # exact matches first, so a fuzzier rule never steals a file
        known = (
            names.get(commit.sha)
            or made_from.get(commit.sha)
            or by_pid.get(patch_id(git, commit.text) or "")
        )
        if known and known not in claimed:
            mapping[commit.sha] = known
            claimed.add(known)
        else:
            pending.append(commit)
    taken = set(patches) | claimed
    for commit in pending:
        found = by_subject.get(commit.subject)
        name = found if found and found not in claimed else patch_file_name(commit.subject, taken)
        mapping[commit.sha] = name
        claimed.add(name)
        taken.add(name)
    return mapping


def _same_change(old: Patch, new_text: str, git: Git) -> bool:
    """Only the formatting differs: same author, subject, message and patch-id."""
    new = parse_patch(new_text, old.path, old.name)
    if (old.author, old.subject, old.body) != (new.author, new.subject, new.body):
        return False
    return patch_id(git, old.path.read_bytes().decode("utf-8", errors="replace")) == patch_id(
        git, new_text
    )


def _series_order(exported: list[str], kept: list[str], original: list[str]) -> list[str]:
    """The exported patches in commit order, with kept (unexported) entries after their old
    neighbour."""
    order = list(exported)
    for name in kept:
        before = original[: original.index(name)]
        anchor = next((n for n in reversed(before) if n in order), None)
        order.insert(order.index(anchor) + 1 if anchor else 0, name)
    return order
