"""``kzbuild patches check``: the whole stack against an upstream commit, in a scratch repo.

The scratch repo lives under ``Settings.scratch`` (never the user's worktree), borrows its
objects from the shared cache like a sync worktree (it is one, at another path) and has no
files checked out: the upstream tree is read into its index and patches are applied there.

Targets (``--against``, ``bump --to``) are a full or unique short sha, a branch or tag of a
git source of the recipe, or ``pypi:llama-cpp-python==X`` (the commit that sdist vendors).
"""

from __future__ import annotations

import logging
import re
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path

from kzbuild.adapters.gitcmd import Git, ls_remote, remote_failure
from kzbuild.adapters.proc import Progress
from kzbuild.adapters.settings import Settings
from kzbuild.errors import ConfigError, SourceError
from kzbuild.model.patch import Patch
from kzbuild.model.recipe import Recipe, Source
from kzbuild.model.stack import Problem
from kzbuild.model.stackcheck import PatchCheck, StackCheck, Target, Verdict
from kzbuild.source.sources import ObjectCache, extract_vendored_gitdirs
from kzbuild.source.stack.apply import (
    ancestry_known,
    apply_any,
    classify,
    history_truncated,
    is_ancestor,
    missing_preimages,
    named_commits,
)
from kzbuild.source.stack.patchfile import read_patch
from kzbuild.source.stack.series import read_series
from kzbuild.source.sync import Worktree

log = logging.getLogger(__name__)

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
SHORT_SHA = re.compile(r"^[0-9a-f]{7,39}$")
PYPI_PREFIX = "pypi:"
DEEPEN_STEPS = (512, 4096, 32768)  # depths tried after --shallow-since, when dates mislead
SHALLOW_SINCE_MARGIN = 86400  # seconds: upstream committer dates are nearly, not strictly, in order


class Scratch:
    """A recipe's scratch repo for checks and bisects: index only, objects from the cache."""

    def __init__(self, settings: Settings, recipe: Recipe) -> None:
        path = settings.scratch / recipe.name.replace("/", "--")
        self.repo = Worktree(settings, recipe, path=path)
        self.git = self.repo.git
        self.cache = ObjectCache(settings)

    def lock(self) -> AbstractContextManager[None]:
        return self.repo.lock()

    def prepare(self) -> None:
        """Create it on first use; refresh where the cache's history stops (it may have
        deepened)."""
        if not (self.repo.path / ".git").is_dir():
            self.repo.create(self.cache)
        self.repo.share_shallow(self.cache)

    def prepare_blobs(self, patches: list[Patch], pin: str) -> None:
        """Put the blobs each patch was made against into the shared cache.

        A patch's preimage is the pin's file plus the patches before it: such blobs exist only
        in the repo that made the patch, yet every 3-way merge at another commit needs them
        (here, in bisects, and in ``git am -3`` when sync applies the stack to a new pin).
        Applying the stack at the pin recreates them.
        """
        missing = missing_preimages(self.cache.git, patches)
        if not missing:
            return
        self.load(pin)
        for patch in patches:
            apply_any(self.git, patch)
        made = missing - missing_preimages(self.git, patches)
        with self.cache.lock():
            for blob in sorted(made):
                data = self.git.run_bytes("cat-file", "blob", blob).stdout
                self.cache.git.run_bytes("hash-object", "-w", "--stdin", input=data)

    def load(self, commit: str) -> None:
        """Make the index (and a detached HEAD) the tree of ``commit``."""
        self.git("update-ref", "--no-deref", "HEAD", commit)
        self.git("read-tree", commit)


def load_patches(recipe: Recipe) -> list[Patch]:
    return [read_patch(entry.path, entry.name) for entry in read_series(recipe.series).entries]


def resolve_target(
    settings: Settings, recipe: Recipe, ref: str, progress: Progress | None = None
) -> Target:
    """Turn what the user typed into a commit and the sources that can provide it."""
    cache = ObjectCache(settings)
    git_sources = tuple(s for s in recipe.upstream.sources if s.kind != "pypi-sdist")
    if ref.startswith(PYPI_PREFIX):
        requirement = ref[len(PYPI_PREFIX) :]
        if "==" not in requirement:
            raise ConfigError(f"'{ref}' must pin a version, like pypi:llama-cpp-python==0.3.36")
        commit = sdist_commit(cache, requirement, progress)
        return Target(commit, (Source("pypi-sdist", requirement),), ref, sdist=requirement)
    if FULL_SHA.match(ref):
        return Target(ref, git_sources, ref)
    if SHORT_SHA.match(ref) and cache.has(ref):
        full = cache.git.resolve(ref)
        if full:
            return Target(full, git_sources, ref)
    tried, unreachable = [], []
    for source in git_sources:
        url = source.location
        result = ls_remote(url, f"refs/heads/{ref}", f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}")
        if not result.ok:
            unreachable.append(f"{source.label} cannot be reached: {remote_failure(result)}")
            continue
        tried.append(source.label)
        refs: dict[str, str] = {}
        for line in result.stdout.splitlines():
            object_id, tab, name = line.partition("\t")
            if tab:
                refs[name] = object_id
        resolved = (
            refs.get(f"refs/tags/{ref}^{{}}")
            or refs.get(f"refs/heads/{ref}")
            or refs.get(f"refs/tags/{ref}")
        )
        if resolved:
            return Target(resolved, (source,), ref)
    if unreachable:
        raise SourceError(
            f"cannot resolve '{ref}': "
            + "; ".join(unreachable)
            + (f"; not a branch or tag of {', '.join(tried)}" if tried else ""),
            hint="check the network and the recipe's upstream.sources, then try again "
            "(a full 40-hex commit is named without asking a remote)",
        )
    raise SourceError(
        f"cannot resolve '{ref}': not a full sha, a known short sha, or a branch or tag of "
        + (", ".join(tried) if tried else "any git source (the recipe has none)"),
        hint="give the full 40-hex commit, a branch of the remote, or pypi:llama-cpp-python==X",
    )


def sdist_commit(cache: ObjectCache, requirement: str, progress: Progress | None = None) -> str:
    """The upstream commit an sdist vendors (remembered next to the sdist: extracting takes
    seconds)."""
    sdist = cache.download_sdist(requirement, progress)
    remembered = sdist.with_name(sdist.name + ".commit")
    if remembered.is_file():
        return remembered.read_text().strip()
    with tempfile.TemporaryDirectory(prefix="kz-sdist-", dir=cache.settings.cache) as tmp:
        gitdirs = extract_vendored_gitdirs(sdist, Path(tmp))
        llama = [g for g in gitdirs if g.name == "llama.cpp"] or gitdirs
        if len(llama) != 1:
            raise SourceError(
                f"{sdist.name} vendors {len(gitdirs)} git repos; cannot tell which is llama.cpp"
            )
        commit = Git(llama[0])("rev-parse", "HEAD")
    remembered.write_text(commit + "\n")
    return commit


def fetch_target(
    settings: Settings, recipe: Recipe, target: Target, progress: Progress | None = None
) -> None:
    """Both the recipe's pin and the target in the cache."""
    cache = ObjectCache(settings)
    cache.ensure(recipe.upstream.commit, recipe.upstream.sources, progress=progress)
    if target.commit != recipe.upstream.commit:
        cache.ensure(target.commit, target.sources or recipe.upstream.sources, progress=progress)


def history(git: Git, since: str | None, target: str) -> tuple[str, int | None]:
    """How much of since..target the cache holds, and how many commits that is."""
    if since is None or since == target:
        return "none needed", 0
    if is_ancestor(git, since, target):
        return "complete", int(git("rev-list", "--count", f"{since}..{target}"))
    if history_truncated(git, target):
        return (
            f"missing: the cache holds {target[:12]} without its history back to {since[:12]} (a "
            "shallow source)",
            None,
        )
    return f"{since[:12]} is not an ancestor of {target[:12]}", None


def check_stack(
    settings: Settings,
    recipe: Recipe,
    *,
    against: str | None = None,
    fetch_history: bool = False,
    progress: Progress | None = None,
) -> StackCheck:
    """Classify every patch of the recipe's series against the pin, or against ``against``."""
    pin = recipe.upstream.commit
    target = (
        resolve_target(settings, recipe, against, progress)
        if against
        else Target(pin, recipe.upstream.sources, pin)
    )
    return check_patches(
        settings,
        recipe,
        load_patches(recipe),
        target,
        fetch_history=fetch_history,
        progress=progress,
    )


def check_patches(
    settings: Settings,
    recipe: Recipe,
    patches: list[Patch],
    target: Target,
    *,
    fetch_history: bool = False,
    progress: Progress | None = None,
) -> StackCheck:
    fetch_target(settings, recipe, target, progress)
    notes = deepen(settings, recipe, target, patches, progress) if fetch_history else []
    scratch = Scratch(settings, recipe)
    pin = recipe.upstream.commit
    since = pin if target.commit != pin else None
    with scratch.lock():
        scratch.prepare()
        scratch.prepare_blobs(patches, pin)
        scratch.load(target.commit)
        state, count = history(scratch.git, since, target.commit)
        results = [classify(scratch.git, patch, target.commit, since=since) for patch in patches]
    return StackCheck(
        target=target.commit,
        since=since,
        history=state,
        commits_between=count,
        patches=tuple(results),
        notes=tuple(notes),
    )


def deepen(
    settings: Settings,
    recipe: Recipe,
    target: Target,
    patches: list[Patch],
    progress: Progress | None = None,
) -> list[str]:
    """Fetch from a git source the history a check can use, when the cache lacks it: the pin..target
    range (for patch-ids), and the target's history back to each commit a patch names (Drop-When,
    Merged, Backport <sha>), so those are checked by ancestry. Returns notes."""
    cache = ObjectCache(settings)
    git = cache.git
    old, new = recipe.upstream.commit, target.commit
    goals = [] if old == new or is_ancestor(git, old, new) else [old]
    goals += [
        sha
        for patch in patches
        for _, _, sha in named_commits(patch)
        if not ancestry_known(git, sha, new)
    ]
    if not goals:
        return []
    sources = [
        s for s in dict.fromkeys(target.sources + recipe.upstream.sources) if s.kind != "pypi-sdist"
    ]
    if not sources:
        return [
            "history missing: no git source to deepen from (an sdist vendors one commit without "
            "its history)"
        ]
    with cache.lock():
        return [_deepen_to(git, sources, goal, new, progress) for goal in dict.fromkeys(goals)]


def fetch_range(
    settings: Settings, recipe: Recipe, target: Target, old: str, progress: Progress | None = None
) -> str | None:
    """Make the history old..target available in the cache from a git source (``kzbuild bisect``):
    None when it already was, else a note of what was fetched or why it could not be."""
    git = ObjectCache(settings).git
    if is_ancestor(git, old, target.commit):
        return None
    sources = [
        s for s in dict.fromkeys(target.sources + recipe.upstream.sources) if s.kind != "pypi-sdist"
    ]
    if not sources:
        return (
            "history missing: no git source to fetch it from (an sdist vendors one commit without "
            "its history)"
        )
    with ObjectCache(settings).lock():
        return _deepen_to(git, sources, old, target.commit, progress)


def _deepen_to(
    git: Git, sources: list[Source], goal: str, new: str, progress: Progress | None
) -> str:
    """Deepen ``new``'s history from the first source that can until ``goal`` is in it, or is shown
    not to be."""
    for source in sources:
        if FULL_SHA.match(goal) and git.resolve(goal) is None:
            # the goal's commit date bounds how deep to fetch; an abbreviated sha
            # falls back to depths
            git.run("fetch", "--no-tags", "--depth=1", source.location, goal, check=False)
        full = git.resolve(goal)
        committed = int(git("log", "-1", "--format=%ct", full)) if full else 0
        since = [f"--shallow-since=@{committed - SHALLOW_SINCE_MARGIN}"] if full else []
        for option in (*since, *(f"--depth={d}" for d in DEEPEN_STEPS)):
            if progress:
                progress(f"deepening from {source.label} ({option})")
            result = git.run("fetch", "--no-tags", option, source.location, new, check=False)
            if not result.ok:
                log.warning(
                    "cannot deepen from %s: %s",
                    source.label,
                    result.stderr.strip().splitlines()[-1:],
                )
                break
            full = git.resolve(goal)
            if full is not None and is_ancestor(git, full, new):
                return f"fetched the history {full[:12]}..{new[:12]} from {source.label}"
            if not history_truncated(git, new):
                return (
                    f"{goal[:12]} is not in the history of {new[:12]} ({source.label} has all of "
                    "it)"
                )
    return f"history missing: no git source could provide {goal[:12]}..{new[:12]}"


def tree_problems(settings: Settings, recipe: Recipe, patches: list[Patch]) -> list[Problem]:
    """Lint against the recipe's pin: every patch must apply exactly, without fuzz or a merge."""
    pin = recipe.upstream.commit
    report = check_patches(settings, recipe, patches, Target(pin, recipe.upstream.sources, pin))
    problems = []
    for patch, result in zip(patches, report.patches, strict=True):
        message = _tree_problem(result, pin)
        if message:
            problems.append(Problem(patch.path, result.lines[0] if result.lines else None, message))
    return problems


def _tree_problem(result: PatchCheck, pin: str) -> str | None:
    at = f"{pin[:12]} (the pin of the recipe)"
    refresh = "refresh it: kzbuild sync, then kzbuild patches export"
    if result.verdict is Verdict.THREE_WAY:
        how = (
            f"with fuzz (context reduced to {result.fuzz_context} lines)"
            if result.fuzz_context is not None
            else "through a 3-way merge"
        )
        return f"applies to {at} only {how}; {result.describe()}; {refresh}"
    if result.verdict is Verdict.CONFLICT:
        return f"does not apply to {at}: {result.describe()}"
    if result.verdict is Verdict.UPSTREAMED:
        return (
            f"is already upstream at {at} ({result.describe()}); drop it: kzbuild patches drop "
            f"{result.name} --reason ..."
        )
    if result.verdict is Verdict.EMPTY:
        return f"changes nothing at {at}: {result.describe()}"
    return None
