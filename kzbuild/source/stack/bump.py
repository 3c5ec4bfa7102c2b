"""``kzbuild bump``: move a recipe's pin to a newer upstream commit, and find what broke a patch.

``plan`` fetches the new commit and checks the stack against it (as ``patches check``), and
counts the upstream commits in between when the cache holds that history. ``write`` then
updates the recipe's pin (and its pypi-sdist source when the target came from one), drops the
upstreamed patches with a record, and syncs to write the lock; it refuses when a patch
conflicts, and puts every file back if the sync fails.

``bisect`` finds, for a conflicting patch, the first upstream commit in old..new where it
stops applying: ``git bisect --no-checkout`` in a scratch repo, each step one apply check of
the stack up to that patch. A shallow cache is deepened from the recipe's git sources; an
sdist source has no history, and bisect says so.
"""

from __future__ import annotations

import logging
import re
from datetime import date as Date

from kzbuild.adapters import yamlconf
from kzbuild.adapters.proc import Progress
from kzbuild.adapters.settings import Settings
from kzbuild.errors import ConfigError, PatchError
from kzbuild.model.patch import Patch
from kzbuild.model.recipe import Recipe, Source
from kzbuild.model.stackcheck import BisectResult, BumpPlan, BumpWritten, Target, UpstreamCommit
from kzbuild.source import recipes
from kzbuild.source.stack.apply import apply_any, history_truncated, is_ancestor
from kzbuild.source.stack.check import Scratch, check_patches, load_patches, resolve_target
from kzbuild.source.stack.patchfile import DROPPED_LOG, drop_patch, read_patch, require_entry
from kzbuild.source.stack.series import read_series
from kzbuild.source.sync import Worktree, check_no_lost_work, inputs_match, read_lock, sync

log = logging.getLogger(__name__)

FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.M)


def plan(
    settings: Settings,
    recipe: Recipe,
    to: str,
    *,
    bisect: bool = False,
    fetch_history: bool = False,
    progress: Progress | None = None,
) -> BumpPlan:
    return plan_target(
        settings,
        recipe,
        resolve_target(settings, recipe, to, progress),
        bisect=bisect,
        fetch_history=fetch_history,
        progress=progress,
    )


def plan_target(
    settings: Settings,
    recipe: Recipe,
    target: Target,
    *,
    bisect: bool = False,
    fetch_history: bool = False,
    progress: Progress | None = None,
) -> BumpPlan:
    """``plan`` for a target already resolved (``kzbuild roll`` resolves its candidates itself)."""
    patches = load_patches(recipe)
    report = check_patches(
        settings, recipe, patches, target, fetch_history=fetch_history or bisect, progress=progress
    )
    bisects: tuple[BisectResult, ...] = ()
    if bisect:
        bisects = tuple(
            bisect_patch(settings, recipe, patches, p.name, target.commit) for p in report.conflicts
        )
    return BumpPlan(recipe, target, report, bisects, tuple(_source_notes(recipe, target)))


def bisect_patch(
    settings: Settings, recipe: Recipe, patches: list[Patch], name: str, new: str
) -> BisectResult:
    """The first commit in old..new at which ``name`` (after the patches before it) stops
    applying."""
    old = recipe.upstream.commit
    index = [p.name for p in patches].index(name)
    scratch = Scratch(settings, recipe)
    with scratch.lock():
        scratch.prepare()
        scratch.prepare_blobs(patches, old)
        git = scratch.git
        if not is_ancestor(git, old, new):
            why = "the cache holds both pins but not the commits between them"
            if not history_truncated(git, new):
                why = f"{old[:12]} is not an ancestor of {new[:12]}"
            return BisectResult(
                name,
                None,
                0,
                0,
                reason=f"history missing: {why}; bisect needs a git source with history",
            )
        commits = int(git("rev-list", "--count", f"{old}..{new}"))
        checks = 0
        if not _lock_shows_applied(recipe, name):
            checks += 1
            if not _applies_at(scratch, patches, index, old):
                return BisectResult(
                    name,
                    None,
                    checks,
                    commits,
                    reason=f"it does not apply at the old pin {old[:12]} either",
                )
        scratch.load(new)
        git.run("bisect", "reset", check=False)  # a run interrupted earlier
        output = git("bisect", "start", "--no-checkout", new, old)
        try:
            while not FIRST_BAD.search(output):
                if checks > commits + 1:
                    raise PatchError(f"bisect of {name} did not converge:\n{output}")
                current = git("rev-parse", "BISECT_HEAD")
                checks += 1
                output = git(
                    "bisect", "good" if _applies_at(scratch, patches, index, current) else "bad"
                )
        finally:
            git.run("bisect", "reset", check=False)
        match = FIRST_BAD.search(output)
        assert match is not None
        sha, subject, author, when = git(
            "log", "-1", "--format=%H%x00%s%x00%an <%ae>%x00%aI", match.group(1)
        ).split("\0")
        return BisectResult(name, UpstreamCommit(sha, subject, author, when), checks, commits)


def _applies_at(scratch: Scratch, patches: list[Patch], index: int, commit: str) -> bool:
    scratch.load(commit)
    for patch in patches[:index]:
        apply_any(scratch.git, patch)
    return apply_any(scratch.git, patches[index])


def _lock_shows_applied(recipe: Recipe, name: str) -> bool:
    """The recipe's lock proves the patch applied at the old pin (so bisect need not check it)."""
    lock = read_lock(recipe.lock_path)
    if lock is None or not inputs_match(recipe, lock):
        return False
    return any(p.file == name and p.commit for p in lock.patches)


def _source_notes(recipe: Recipe, target: Target) -> list[str]:
    notes = []
    for source in recipe.upstream.sources:
        if source.kind == "pypi-sdist" and not _same_package(source, target.sdist):
            notes.append(
                f"source {source.label} vendors the old pin, not {target.commit[:12]}: update or "
                "remove it"
            )
    return notes


def _same_package(source: Source, requirement: str | None) -> bool:
    return requirement is not None and source.location.split("==")[0] == requirement.split("==")[0]


def write(
    settings: Settings,
    recipe: Recipe,
    bump: BumpPlan,
    *,
    today: Date | None = None,
    progress: Progress | None = None,
) -> BumpWritten:
    """Update the pin, drop upstreamed patches with a record, and sync (which writes the lock)."""
    if bump.check.conflicts:
        names = ", ".join(p.name for p in bump.check.conflicts)
        raise PatchError(
            f"not writing: {len(bump.check.conflicts)} patch(es) conflict with "
            f"{bump.target.commit[:12]}: {names}",
            hint="rebase them onto the new pin in the worktree first (see --bisect for the "
            "upstream commit that broke each)",
        )
    check_no_lost_work(Worktree(settings, recipe).state(), what="bump --write", recipe=recipe.name)
    touched = [recipe.path, recipe.series, recipe.series.parent / DROPPED_LOG]
    touched += [recipe.series.parent / p.name for p in bump.check.upstreamed]
    saved = {path: path.read_bytes() if path.exists() else None for path in touched}
    try:
        _write_pin(recipe, bump.target)
        for result in bump.check.upstreamed:
            proof = result.proof
            assert proof is not None
            # the commit that upstreamed it: the patch's own Drop-When, else the proof's, else
            # the new pin
            entry = require_entry(read_series(recipe.series), result.name)
            upstream = read_patch(entry.path, result.name).drop_when or proof.commit
            drop_patch(
                recipe.series,
                result.name,
                today=today,
                upstream=upstream or bump.target.commit,
                reason=f"upstreamed in {bump.target.commit[:12]} ({proof.describe()})",
            )
        bumped = recipes.load_recipe(settings.project, str(recipe.path))
        synced = sync(settings, bumped, progress=progress)
    except BaseException:
        for path, data in saved.items():
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(data)
        raise
    dropped = tuple(p.name for p in bump.check.upstreamed)
    return BumpWritten(
        recipe.path, dropped, synced, tuple(_shared_series_notes(settings, recipe, dropped))
    )


def _write_pin(recipe: Recipe, target: Target) -> None:
    """Edit only the lines that change, so comments and layout stay."""
    doc = yamlconf.load(recipe.path)
    lines = recipe.path.read_text(encoding="utf-8").splitlines(keepends=True)
    upstream = doc.get_mapping("upstream")
    edits = [(upstream.line_of("commit"), recipe.upstream.commit, target.commit)]
    if target.sdist:
        for item in upstream.get_list("sources"):
            old = item.get("pypi-sdist") if isinstance(item, yamlconf.Mapping) else None
            if old and _same_package(Source("pypi-sdist", old), target.sdist):
                edits.append((item.line_of("pypi-sdist"), old, target.sdist))
    for line, old, new in edits:
        if old not in lines[line - 1]:
            raise ConfigError(
                f"expected '{old}' on this line; edit the recipe by hand",
                path=recipe.path,
                line=line,
            )
        lines[line - 1] = lines[line - 1].replace(old, new, 1)
    recipe.path.write_text("".join(lines), encoding="utf-8")


def _shared_series_notes(settings: Settings, recipe: Recipe, dropped: tuple[str, ...]) -> list[str]:
    if not dropped:
        return []
    notes = []
    for name in recipes.list_recipes(settings.recipes):
        other = recipes.load_recipe(settings.project, name)
        if other.name != recipe.name and other.series == recipe.series:
            notes.append(
                f"recipe {other.name} (pin {other.upstream.commit[:12]}) uses the same series: it "
                f"no longer gets {', '.join(dropped)}"
            )
    return notes
