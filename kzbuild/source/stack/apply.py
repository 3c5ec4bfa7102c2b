"""Classify one patch against an upstream tree held in a git index.

Everything here works on a repository's index with ``git apply --cached``, never on files,
so a check of the whole stack writes nothing but a few blobs, and the same code serves the
scratch repos of ``patches check`` and bisect and the user's worktree during sync (where
it only reads).

Order of the tests, from the strongest evidence to the weakest:
1. the patch changes nothing -> ``empty``;
2. a commit the patch names (Drop-When, Merged, Backport) is in the target's history, or an
   upstream commit in the fetched range has the same patch-id -> ``upstreamed``;
3. it applies exactly -> ``clean``;
4. it reverse-applies on the target (exactly, or with less context when its added lines
   occur exactly once there) -> ``upstreamed``;
5. a 3-way merge with the blobs named in its index lines succeeds -> ``3way`` (or ``empty``
   when the merge changes nothing), else ``conflict``.
"""

from __future__ import annotations

import re
from pathlib import Path

from kzbuild.adapters import proc
from kzbuild.adapters.gitcmd import Git
from kzbuild.model.patch import Patch
from kzbuild.model.stackcheck import PatchCheck, Proof, Verdict
from kzbuild.source.stack.patchfile import DIFF_OPTIONS, SHA, hunk_text

PATCH_FAILED = re.compile(r"^error: patch failed: (.+):(\d+)$")
FILE_ERROR = re.compile(
    r"^error: (.+?): (does not exist in index|already exists in index|patch does not apply|does "
    r"not match index)$"
)
MISSING_BLOB = re.compile(
    r"lacks the necessary blob|sha1 information is lacking|cannot read the current contents", re.I
)
FUZZ_CONTEXT = (2, 1)  # context lines to try when probing whether a patch applies with fuzz
DISTINCT_LINE = 8  # non-blank characters an added line needs to locate a hunk without its context


def apply(git: Git, patch: Patch, *args: str, text: str | None = None) -> proc.Result:
    """``git apply --cached`` of the patch file (or of ``text``) in ``git``'s index."""
    source = "-" if text is not None else str(patch.path)
    return git.run("apply", "--cached", *args, source, check=False, input=text)


def shallow_commits(git: Git) -> set[str]:
    path = Path(git("rev-parse", "--git-path", "shallow"))
    path = path if path.is_absolute() else git.repo / path
    return set(path.read_text().split()) if path.is_file() else set()


def is_ancestor(git: Git, ancestor: str, commit: str) -> bool:
    return git.run("merge-base", "--is-ancestor", ancestor, commit, check=False).ok


def history_truncated(git: Git, commit: str) -> bool:
    """Whether the history of ``commit`` here stops at a shallow boundary."""
    return any(is_ancestor(git, boundary, commit) for boundary in shallow_commits(git))


def patch_id(git: Git, diff: str) -> str | None:
    out = git.run("patch-id", "--stable", input=diff).stdout.split()
    return out[0] if out else None


def missing_preimages(git: Git, patches: list[Patch]) -> set[str]:
    """Blobs the patches were made against that this repository lacks (a 3-way merge needs them)."""
    wanted = sorted(
        {change.preimage for patch in patches for change in patch.files if change.preimage}
    )
    if not wanted:
        return set()
    out = git.run("cat-file", "--batch-check", input="".join(f"{blob}\n" for blob in wanted)).stdout
    return {line.split()[0] for line in out.splitlines() if line.endswith(" missing")}


def commit_summary(git: Git, sha: str) -> str:
    return git("log", "-1", "--format=%h %s", sha)


def classify(git: Git, patch: Patch, target: str, *, since: str | None = None) -> PatchCheck:
    """Classify ``patch`` against the index, applying it there when it is clean or 3way."""
    if not patch.files:
        return PatchCheck(patch.name, Verdict.EMPTY, note="the patch changes no files")
    notes: list[str] = []
    proof = find_upstreamed(git, patch, target, since=since, notes=notes)
    if proof:
        return PatchCheck(patch.name, Verdict.UPSTREAMED, proof=proof)
    exact = apply(git, patch)
    if exact.ok:
        return PatchCheck(patch.name, Verdict.CLEAN, note="; ".join(notes))
    return _merge(git, patch, exact, target, notes)


def find_upstreamed(
    git: Git, patch: Patch, target: str, *, since: str | None = None, notes: list[str] | None = None
) -> Proof | None:
    """Proof that upstream ``target`` already has the patch, or None. Reads the index, never changes
    it."""
    notes = [] if notes is None else notes
    proof = _named_commit_proof(git, patch, target, notes)
    if proof is None and since is not None:
        proof = _patch_id_proof(git, patch, target, since)
    if proof is None and not apply(git, patch, "--check").ok:
        proof = _reverse_proof(git, patch, target)
    return proof


def named_commits(patch: Patch) -> list[tuple[str, str, str]]:
    """The upstream commits the patch names as obsoleting it: (proof kind, trailer, sha)."""
    backport = (patch.upstream_status or "").removeprefix("Backport ").strip()
    named = (
        ("drop-when", "Drop-When", patch.drop_when),
        ("merged", "Upstream-Status: Merged", patch.merged_commit),
        (
            "backport",
            "Upstream-Status: Backport",
            backport if patch.status_kind == "Backport" and SHA.match(backport) else None,
        ),
    )
    return [(kind, label, sha) for kind, label, sha in named if sha]


def ancestry_known(git: Git, sha: str, target: str) -> bool:
    """Whether this repository can tell if ``sha`` is in the history of ``target``."""
    full = git.resolve(sha)
    return full is not None and (
        is_ancestor(git, full, target) or not history_truncated(git, target)
    )


def _named_commit_proof(git: Git, patch: Patch, target: str, notes: list[str]) -> Proof | None:
    """The patch names an upstream commit that obsoletes it: is that commit in the target's
    history?"""
    for kind, label, sha in named_commits(patch):
        full = git.resolve(sha)
        if full is None:
            notes.append(f"{label} {sha} is not in the cache (history missing): cannot verify it")
        elif is_ancestor(git, full, target):
            return Proof(kind, full, f"{label} {full[:12]} is in the history of {target[:12]}")
        elif history_truncated(git, target):
            notes.append(
                f"cannot tell whether {label} {sha} is in the history of {target[:12]}: history "
                "missing"
            )
        elif kind == "merged":
            notes.append(
                f"claims {label} {sha}, but that commit is not in the history of {target[:12]}"
            )
    return None


def _patch_id_proof(git: Git, patch: Patch, target: str, since: str) -> Proof | None:
    """An upstream commit in since..target with the same patch-id (the patch was cherry-picked
    verbatim)."""
    ours = patch_id(git, patch.path.read_bytes().decode("utf-8", errors="replace"))
    paths = sorted({p for change in patch.files for p in (change.path, change.old_path) if p})
    if ours is None or not paths:
        return None
    log = git.run(
        "log",
        "-p",
        "--no-merges",
        "--format=commit %H",
        *DIFF_OPTIONS,
        target,
        f"^{since}",
        "--",
        *paths,
    ).stdout
    if not log.strip():
        return None
    boundaries = shallow_commits(git)  # their diffs are against nothing: not real commits' changes
    for line in git.run("patch-id", "--stable", input=log).stdout.splitlines():
        pid, sha = line.split()
        if pid == ours and sha not in boundaries:
            return Proof("patch-id", sha, f"same patch-id as upstream {commit_summary(git, sha)}")
    return None


def _reverse_proof(git: Git, patch: Patch, target: str) -> Proof | None:
    """Upstream holds the patch's result: undoing it applies to the target."""
    if apply(git, patch, "--check", "-R").ok:
        return Proof("reverse-apply", None, f"reverse-applies cleanly on {target[:12]}")
    for context in (2, 1, 0):
        if apply(git, patch, "--check", "-R", f"-C{context}").ok:
            if not _added_lines_unique(git, patch):
                return None
            return Proof(
                "reverse-apply",
                None,
                f"reverse-applies on {target[:12]} with context reduced to {context} line(s) "
                "(upstream changed the code around it); each hunk's added lines occur exactly once "
                "there",
            )
    return None


def _added_lines_unique(git: Git, patch: Patch) -> bool:
    """Every hunk's added lines stand out: a block found exactly once in the target, with a real
    line in it."""
    for change in patch.files:
        if change.binary:
            return False
        blob = git.run("cat-file", "blob", f":{change.path}", check=False)
        if not blob.ok:
            return False
        content = "\n" + blob.stdout
        for hunk in change.hunks:
            if not any(len(line.strip()) >= DISTINCT_LINE for line in hunk.added):
                return False
            if content.count("\n" + "\n".join(hunk.added) + "\n") != 1:
                return False
    return True


def _merge(git: Git, patch: Patch, exact: proc.Result, target: str, notes: list[str]) -> PatchCheck:
    """The patch does not apply as written: try the 3-way merge ``git am -3`` would do."""
    failed = failed_hunks(patch, exact.stderr)
    fuzz = next((c for c in FUZZ_CONTEXT if apply(git, patch, "--check", f"-C{c}").ok), None)
    saved = git("write-tree")
    merged = apply(git, patch, "--3way")
    if merged.ok:
        if git("write-tree") == saved:
            return PatchCheck(
                patch.name,
                Verdict.EMPTY,
                note=f"a 3-way merge on {target[:12]} changes nothing: upstream may hold it, but "
                "no proof was found",
            )
        return PatchCheck(
            patch.name,
            Verdict.THREE_WAY,
            files=_files(failed),
            hunks=_hunk_names(failed),
            lines=tuple(h[1] for h in failed if h[1]),
            fuzz_context=fuzz,
            note="; ".join(notes),
        )
    conflicted = sorted(
        {line.split("\t", 1)[1] for line in git("ls-files", "-u").splitlines() if "\t" in line}
    )
    git("read-tree", saved)
    if MISSING_BLOB.search(merged.stderr):
        notes.append("no 3-way merge: the blobs the patch was made from are not in the cache")
    failing = conflicting_hunks(git, patch, set(conflicted) or set(_files(failed)))
    return PatchCheck(
        patch.name,
        Verdict.CONFLICT,
        files=tuple(conflicted) or _files(failed),
        hunks=_hunk_names(failing),
        lines=tuple(h[1] for h in failing if h[1]),
        fuzz_context=fuzz,
        note="; ".join(notes),
    )


def apply_any(git: Git, patch: Patch) -> bool:
    """Apply as ``git am -3`` would (exactly, else by 3-way merge); on a conflict leave the index as
    it was."""
    if apply(git, patch).ok:
        return True
    saved = git("write-tree")
    if apply(git, patch, "--3way").ok:
        return True
    git("read-tree", saved)
    return False


Failure = tuple[str, int | None, str]  # (file, patch line of the hunk, description)


def failed_hunks(patch: Patch, stderr: str) -> list[Failure]:
    """Map ``git apply``'s errors to the hunks of the patch file they are about."""
    failures: list[Failure] = []
    for line in stderr.splitlines():
        if match := PATCH_FAILED.match(line.strip()):
            path, old_line = match.group(1), int(match.group(2))
            change = next((c for c in patch.files if c.path == path or c.old_path == path), None)
            hunk = (
                next((h for h in change.hunks if h.old_start == old_line), None) if change else None
            )
            if hunk:
                failures.append((path, hunk.line, f"{path} {hunk.header} (patch line {hunk.line})"))
            else:
                failures.append((path, None, f"{path}:{old_line}"))
        elif (match := FILE_ERROR.match(line.strip())) and not any(
            f[0] == match.group(1) for f in failures
        ):
            failures.append((match.group(1), None, f"{match.group(1)}: {match.group(2)}"))
    return failures


def conflicting_hunks(git: Git, patch: Patch, files: set[str]) -> list[Failure]:
    """Each hunk of those files tried on its own: the ones that do not apply."""
    failures: list[Failure] = []
    for change in patch.files:
        if change.path not in files and change.old_path not in files:
            continue
        if not change.hunks:
            failures.append((change.path, change.line, f"{change.path} (patch line {change.line})"))
            continue
        for hunk in change.hunks:
            if not apply(git, patch, "--check", text=hunk_text(patch, change, hunk)).ok:
                failures.append(
                    (
                        change.path,
                        hunk.line,
                        f"{change.path} {hunk.header} (patch line {hunk.line})",
                    )
                )
    return failures


def _files(failures: list[Failure]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f[0] for f in failures))


def _hunk_names(failures: list[Failure]) -> tuple[str, ...]:
    return tuple(f[2] for f in failures)
