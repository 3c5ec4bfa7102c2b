"""``kzbuild roll``: try newer upstream commits, say who broke which patch, and find the newest that
rolls.

Candidates, unless given (``--to``, in the forms ``bump`` takes): each git source's default branch
head and its newest tags, and each pypi-sdist source's newer llama-cpp-python versions
(``pip index versions``, pip's own configuration); at most ``limit`` of each kind, tried newest
first (by committer date).

Each candidate: the stack checked as ``bump --bisect`` does (every conflict's breaking upstream
commit, its PR number, author and date, or "history missing"). While no newer candidate is
rollable, one whose stack holds is rolled in a stage (a git worktree of the project at HEAD, or a
copy, under ``<work>/roll/``, with a work dir of its own; the user's checkout and sync worktree
are never touched): pin and lock written and upstreamed patches dropped as ``bump --write``
does, a host build, each live patch's ``Kz-Test:`` run with pytest, the v79 build plan, and, with
a bench runner, the pin and the candidate benched interleaved. With ``write``, the rollable
candidate's stage is committed on the branch ``kz/roll/<sha7>`` of the project repo; a project
with uncommitted recipes/ or patches/, or such a branch holding other content, is not written
(the report's notes say why; the CLI exits 4 after writing the report). A branch holding the
same content is reused.

The stages never outlive a roll: SIGTERM and SIGHUP end it like Ctrl-C (the stage removed on the
way out), and a roll starts by removing what a killed one left (its worktree unregistered).
"""

from __future__ import annotations

import logging
import re
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from packaging.version import InvalidVersion, Version

from kzbuild.adapters import proc, yamlconf
from kzbuild.adapters.filelock import locked
from kzbuild.adapters.gitcmd import KZ_AUTHOR, Git, ls_remote, remote_failure
from kzbuild.adapters.proc import Progress
from kzbuild.adapters.settings import Settings
from kzbuild.build import builder
from kzbuild.errors import KzError, SourceError
from kzbuild.measure.stats import interleaved_order, median_effect
from kzbuild.model.patch import KZ_TEST
from kzbuild.model.quality import QualityRecord
from kzbuild.model.recipe import Recipe, Source
from kzbuild.model.result import summarize
from kzbuild.model.roll import (
    DEFAULT_BLOCKS,
    DEFAULT_LIMIT,
    DEFAULT_THRESHOLD_PCT,
    PLAN_TARGET,
    BenchDelta,
    Candidate,
    CandidateResult,
    Outcome,
    RollReport,
    RollStep,
    Unchecked,
    pr_number,
)
from kzbuild.model.stackcheck import BumpPlan, StepStatus, Target, UpstreamCommit, Verdict
from kzbuild.source import recipes
from kzbuild.source.sources import ObjectCache
from kzbuild.source.stack import bump
from kzbuild.source.stack.check import PYPI_PREFIX, fetch_target, load_patches, resolve_target

log = logging.getLogger(__name__)

HOST_TARGET = "host"
BRANCH_PREFIX = "kz/roll/"
PIN_STAGE = "--pin"  # the stage the pin is built in, for the bench
TEST_TIMEOUT = 3600.0
STAGED_DIRS = (
    "recipes",
    "patches",
    "kernels",
    "toolchains",
)  # what the stage takes from the working tree
LIVE = (Verdict.CLEAN, Verdict.THREE_WAY)
NO_HOOKS = ("-c", "core.hooksPath=/dev/null")  # the user's hooks are not run in the stage


class ABRunner(Protocol):
    """Runs builds on a device in a given interleaved order
    (kzbuild.measure.rolldevice.DeviceRunner: a real device).

    ``run`` gets each variant's artifact folder, the blocks of variant names to run, in order, and
    the seed that drew them; it returns each variant's samples of ``metric`` (higher is better),
    one per run."""

    metric: str
    quality: Sequence[
        QualityRecord
    ]  # after run: each variant's output against the reference, when the plan checks it
    # after run: by variant, the plan's memory limits its runs exceeded (none: within them)
    memory_over: Mapping[str, Sequence[str]]

    def run(
        self, variants: Mapping[str, Path], order: Sequence[Sequence[str]], seed: int
    ) -> Mapping[str, Sequence[float]]: ...


# --- candidates ---


def find_candidates(
    settings: Settings,
    recipe: Recipe,
    to: Sequence[str] = (),
    *,
    limit: int = DEFAULT_LIMIT,
    progress: Progress | None = None,
) -> tuple[list[tuple[Candidate, Target]], list[str], list[Unchecked]]:
    """The candidates, newest first, with their targets; notes on sources that gave none; and the
    sources that could not be asked."""
    cache = ObjectCache(settings)
    pin = recipe.upstream.commit
    cache.ensure(pin, recipe.upstream.sources, progress=progress)
    pin_time, _ = _committed(cache, pin)
    notes: list[str] = []
    unchecked: list[Unchecked] = []
    found: list[tuple[Candidate, Target]] = []
    if to:
        for ref in to:
            target = resolve_target(settings, recipe, ref, progress)
            found.append((Candidate(ref, target.commit, "--to"), target))
    else:
        for source in recipe.upstream.sources:
            if source.kind == "pypi-sdist":
                found += _pypi_candidates(
                    settings, recipe, source, limit, notes, unchecked, progress
                )
            else:
                found += _git_candidates(settings, source, limit, unchecked, progress)
    dated: list[tuple[int, Candidate, Target]] = []
    seen: dict[str, Candidate] = {}
    for candidate, target in found:
        fetch_target(settings, recipe, target, progress)
        when, date = _committed(cache, target.commit)
        if not to and (target.commit == pin or when <= pin_time):
            continue  # not newer than the pin
        if target.commit in seen:
            notes.append(
                f"{candidate.label} is the same commit as {seen[target.commit].label} "
                f"({target.commit[:12]})"
            )
            continue
        seen[target.commit] = candidate
        dated.append((when, replace(candidate, date=date), target))
    dated.sort(key=lambda item: -item[0])
    return [(c, t) for _, c, t in dated], notes, unchecked


def _committed(cache: ObjectCache, commit: str) -> tuple[int, str]:
    """The commit's committer time: (Unix seconds, ISO 8601), from one git log."""
    seconds, _, iso = cache.git("log", "-1", "--format=%ct %cI", commit).partition(" ")
    return int(seconds), iso


def _git_candidates(
    settings: Settings,
    source: Source,
    limit: int,
    unchecked: list[Unchecked],
    progress: Progress | None,
) -> list[tuple[Candidate, Target]]:
    """The default branch's head and the ``limit`` highest-versioned tags of a git source."""
    url = source.location
    if progress:
        progress(f"listing {source.label}")
    result = ls_remote(url, "HEAD", "refs/tags/*", options=("--symref",))
    if not result.ok:
        why = f"cannot list its branches and tags: {remote_failure(result)}"
        unchecked.append(Unchecked(source.label, why))
        return []
    head_branch, head = None, None
    tags: dict[str, str] = {}
    for line in result.stdout.splitlines():
        left, _, name = line.partition("\t")
        if left.startswith("ref: ") and name == "HEAD":
            head_branch = left[len("ref: ") :].removeprefix("refs/heads/")
        elif name == "HEAD":
            head = left
        elif name.startswith("refs/tags/"):
            tag = name.removeprefix("refs/tags/")
            if tag.endswith("^{}"):
                tags[tag[:-3]] = left  # the commit an annotated tag points at
            else:
                tags.setdefault(tag, left)
    found = []
    if head:
        found.append(
            (
                Candidate(head_branch or "HEAD", head, "default branch"),
                Target(head, (source,), head_branch or "HEAD"),
            )
        )
    for tag in sorted(tags, key=_natural, reverse=True)[:limit]:
        found.append((Candidate(tag, tags[tag], "tag"), Target(tags[tag], (source,), tag)))
    return found


def _natural(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key that orders b9 before b10 and v1.2 before v1.10."""
    return tuple(
        (int(part), "") if part.isdigit() else (-1, part)
        for part in re.split(r"(\d+)", name)
        if part
    )


def _pypi_candidates(
    settings: Settings,
    recipe: Recipe,
    source: Source,
    limit: int,
    notes: list[str],
    unchecked: list[Unchecked],
    progress: Progress | None,
) -> list[tuple[Candidate, Target]]:
    """The ``limit`` newest versions on the index above the pinned one, through ``pip index
    versions``."""
    package, _, pinned = source.location.partition("==")
    try:
        current = Version(pinned)
    except InvalidVersion:
        notes.append(f"{source.label}: '{pinned}' is not a version; no pypi candidates")
        return []
    if progress:
        progress(f"asking pip for the versions of {package}")
    result = proc.run(
        [sys.executable, "-m", "pip", "index", "versions", "--disable-pip-version-check", package],
        check=False,
    )
    listed = re.search(r"^Available versions:(.*)$", result.stdout, re.M)
    if not result.ok or not listed:
        why = f"pip index versions {package} failed: {_last_line(result.stderr or result.stdout)}"
        unchecked.append(Unchecked(source.label, why))
        return []
    newer = []
    for word in listed.group(1).split(","):
        try:
            version = Version(word.strip())
        except InvalidVersion:
            continue
        if version > current:
            newer.append(version)
    found = []
    for version in sorted(newer, reverse=True)[:limit]:
        label = f"{PYPI_PREFIX}{package}=={version}"
        try:
            target = resolve_target(settings, recipe, label, progress)
        except SourceError as exc:
            unchecked.append(Unchecked(label, exc.message))
            continue
        found.append((Candidate(label, target.commit, "pypi"), target))
    return found


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# --- the stage: the project rolled to a candidate, outside the user's checkout ---


class Stage:
    """``<work>/roll/<recipe>/project``: a git worktree of the project at HEAD with the working
    tree's recipes/ and patches/ (or, outside git, a copy), and ``work/`` its own kzbuild work
    dir."""

    def __init__(self, settings: Settings, recipe: Recipe, name: str = "") -> None:
        self.root = settings.work / "roll" / (recipe.name.replace("/", "--") + name)
        self.project = self.root / "project"
        self.settings = Settings(
            project=self.project,
            cache=settings.cache,
            work=self.root / "work",
            results_dir=settings.results_dir,
        )
        self.source = settings.project
        self.repo = Git(settings.project) if is_git_repo(settings.project) else None
        self.recipe_name = recipe.name

    def create(self) -> Recipe:
        self.remove()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.repo is not None:
            self.repo(
                *NO_HOOKS, "worktree", "add", "--detach", "--force", str(self.project), "HEAD"
            )
            for folder in STAGED_DIRS:
                shutil.rmtree(self.project / folder, ignore_errors=True)
                if (self.source / folder).is_dir():
                    shutil.copytree(self.source / folder, self.project / folder)
        else:
            skip = {".git", ".kz", ".venv"}
            if self.root.is_relative_to(self.source):
                skip.add(
                    self.root.relative_to(self.source).parts[0]
                )  # the work dir: the stage itself
            shutil.copytree(
                self.source,
                self.project,
                ignore=lambda folder, names: [
                    n for n in names if Path(folder) == self.source and n in skip
                ],
            )
        return recipes.load_recipe(self.project, self.recipe_name)

    def hold(self) -> ExitStack:
        """The stage's lock (``<stage>.lock``), held until the returned stack is closed; Busy,
        naming the holder's pid, while another kzbuild holds it."""
        stack = ExitStack()
        lock = self.root.with_name(self.root.name + ".lock")
        stack.enter_context(locked(lock, what=f"the roll stage {self.root}", wait=0))
        return stack

    def remove(self) -> None:
        if self.repo is not None and (self.project / ".git").exists():
            self.repo.run("worktree", "remove", "--force", str(self.project), check=False)
        shutil.rmtree(self.project, ignore_errors=True)
        if self.repo is not None:
            self.repo.run("worktree", "prune", check=False)


def is_git_repo(path: Path) -> bool:
    return (path / ".git").exists()


# --- one candidate ---


def roll(
    settings: Settings,
    recipe: Recipe,
    *,
    to: Sequence[str] = (),
    limit: int = DEFAULT_LIMIT,
    build: bool = True,
    tests: bool = True,
    plan_target: str | None = PLAN_TARGET,
    bench: ABRunner | None = None,
    blocks: int = DEFAULT_BLOCKS,
    seed: int = 0,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    write: bool = False,
    environ: Mapping[str, str],
    progress: Progress | None = None,
) -> RollReport:
    """Try each candidate, newest first; roll (build, test, plan, bench) the first whose stack
    holds,
    and the next one whenever a rolled candidate fails; with ``write``, commit the rollable one."""
    stage = Stage(settings, recipe)
    held = stage.hold()  # another roll of this recipe: Busy (exit 10), never a shared stage
    try:
        with _terminate_as_interrupt():
            for left in (stage, Stage(settings, recipe, PIN_STAGE)):
                # what a killed roll left: its worktree, registered in the project
                # repo
                left.remove()
            return _roll(
                settings,
                recipe,
                stage,
                to=to,
                limit=limit,
                build=build,
                tests=tests,
                plan_target=plan_target,
                bench=bench,
                blocks=blocks,
                seed=seed,
                threshold_pct=threshold_pct,
                write=write,
                environ=environ,
                progress=progress,
            )
    finally:
        held.close()


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as Ctrl-C does, so every
    ``finally`` runs (the stage is removed, a running build is stopped) before the exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    saved = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _roll(
    settings: Settings,
    recipe: Recipe,
    stage: Stage,
    *,
    to: Sequence[str],
    limit: int,
    build: bool,
    tests: bool,
    plan_target: str | None,
    bench: ABRunner | None,
    blocks: int,
    seed: int,
    threshold_pct: float,
    write: bool,
    environ: Mapping[str, str],
    progress: Progress | None,
) -> RollReport:
    notes: list[str] = []
    if write and (problem := write_problem(settings)) is not None:
        notes.append(f"not written: {problem}")
        write = False
    candidates, found_notes, unchecked = find_candidates(
        settings, recipe, to, limit=limit, progress=progress
    )
    notes += found_notes
    results: list[CandidateResult] = []
    pin_artifact: Path | None = None
    branch = commit = None
    try:
        for candidate, target in candidates:
            if progress:
                progress(f"checking the stack at {candidate.label} ({target.commit[:12]})")
            plan = bump.plan_target(settings, recipe, target, bisect=True, progress=progress)
            if plan.check.conflicts:
                results.append(CandidateResult(candidate, plan, Outcome.CONFLICT))
                continue
            if any(r.outcome is Outcome.ROLLABLE for r in results):
                results.append(CandidateResult(candidate, plan, Outcome.NOT_TRIED))
                continue
            rolled = stage.create()
            steps, outcome, artifact = _roll_steps(
                stage,
                rolled,
                plan,
                build=build,
                tests=tests,
                plan_target=plan_target,
                environ=environ,
                progress=progress,
            )
            delta = None
            if outcome is Outcome.ROLLABLE and bench is not None and artifact is not None:
                if pin_artifact is None:
                    pin_artifact = _pin_artifact(settings, recipe, environ, progress)
                delta = bench_ab(
                    bench,
                    pin_artifact,
                    artifact,
                    blocks=blocks,
                    seed=seed,
                    threshold_pct=threshold_pct,
                )
                steps.append(
                    RollStep(
                        "bench",
                        f"bench the pin against {candidate.label} interleaved on the device",
                        StepStatus.FAILED
                        if delta.regressed or delta.wrong or delta.memory_over
                        else StepStatus.PASSED,
                        delta.describe(),
                    )
                )
                if delta.wrong:  # wrong whatever its speed (as kzbuild ab: 17, then 9, then 15)
                    outcome = Outcome.WRONG
                elif delta.regressed:
                    outcome = Outcome.REGRESSED
                elif delta.memory_over:
                    outcome = Outcome.OVER_BUDGET
            elif outcome is Outcome.ROLLABLE and bench is not None:
                steps.append(
                    RollStep(
                        "bench",
                        "bench the pin against the candidate",
                        StepStatus.SKIPPED,
                        "no host build to bench (--no-build)",
                    )
                )
            results.append(CandidateResult(candidate, plan, outcome, tuple(steps), delta))
            if outcome is Outcome.ROLLABLE and write:
                branch, commit = _commit_branch(
                    stage,
                    target.commit,
                    RollReport(recipe.name, recipe.upstream.commit, tuple(results)),
                    notes,
                )
    finally:
        stage.remove()
    return RollReport(
        recipe.name,
        recipe.upstream.commit,
        tuple(results),
        tuple(notes),
        branch,
        commit,
        tuple(unchecked),
    )


def write_problem(settings: Settings) -> str | None:
    """Why --write cannot write here: it needs a git project whose recipes/ and patches/ are
    committed (the branch starts at HEAD); None when it can."""
    if not is_git_repo(settings.project):
        return (
            f"--write needs the project {settings.project} to be a git repository "
            "(the roll goes on a branch of it)"
        )
    dirty = Git(settings.project)(
        "status", "--porcelain", "--untracked-files=all", "--", *STAGED_DIRS
    )
    if dirty:
        return (
            "--write: the project has uncommitted changes the roll branch would not hold "
            "(commit or stash them; the branch kz/roll/<sha7> starts at HEAD): "
            + "; ".join(dirty.splitlines())
        )
    return None


def _roll_steps(
    stage: Stage,
    rolled: Recipe,
    plan: BumpPlan,
    *,
    build: bool,
    tests: bool,
    plan_target: str | None,
    environ: Mapping[str, str],
    progress: Progress | None,
) -> tuple[list[RollStep], Outcome, Path | None]:
    steps: list[RollStep] = []
    try:
        written = bump.write(
            stage.settings, rolled, replace(plan, recipe=rolled), progress=progress
        )
    except KzError as exc:
        steps.append(
            RollStep(
                "sync",
                "write the pin and lock, sync the stack",
                StepStatus.FAILED,
                _error_text(exc),
            )
        )
        return steps, Outcome.BUILD_FAILED, None
    described = describe_roll(rolled, plan.target)
    after = recipes.load_recipe(stage.project, rolled.name)
    detail = f"head {written.sync.lock.head[:12]}; description: {described}"
    label = "write the pin and lock, sync the stack"
    steps.append(RollStep("sync", label, StepStatus.PASSED, detail))
    artifact = None
    if build:
        if progress:
            progress(f"building {after.name} for {HOST_TARGET} at {plan.target.commit[:12]}")
        try:
            result = builder.build(
                builder.prepare(stage.settings, after, HOST_TARGET, environ=environ)
            )
        except KzError as exc:
            steps.append(
                RollStep("build", f"build for {HOST_TARGET}", StepStatus.FAILED, _error_text(exc))
            )
            return steps, Outcome.BUILD_FAILED, None
        artifact = result.artifact.path
        steps.append(
            RollStep(
                "build",
                f"build for {HOST_TARGET}",
                StepStatus.PASSED,
                f"build {result.artifact.build_id}" + (" (reused)" if result.reused else ""),
            )
        )
    else:
        steps.append(
            RollStep("build", f"build for {HOST_TARGET}", StepStatus.SKIPPED, "--no-build")
        )
    if tests:
        step = run_kz_tests(stage.project, after, plan, environ)
        steps.append(step)
        if step.status is StepStatus.FAILED:
            return steps, Outcome.TESTS_FAILED, artifact
    else:
        steps.append(
            RollStep("tests", "the live patches' Kz-Test", StepStatus.SKIPPED, "--no-tests")
        )
    if plan_target:
        steps.append(_plan_step(stage.settings, after, plan_target, environ))
        if steps[-1].status is StepStatus.FAILED:
            return steps, Outcome.BUILD_FAILED, artifact
    return steps, Outcome.ROLLABLE, artifact


ROLLED_NOTE = re.compile(r"\s*\(rolled to [^()]*\)$")


def describe_roll(recipe: Recipe, target: Target) -> str:
    """Say in the rolled recipe's description what it is now: the old pin's sha (7+ hex) in it
    becomes the new one's, and a ``(rolled to LABEL SHA12)`` note replaces an earlier one. Only
    its line changes; a description that is not one plain line is left as it is (and said so)."""
    old = recipe.description
    pin = recipe.upstream.commit
    new = re.sub(
        rf"\b{pin[:7]}[0-9a-f]{{0,33}}\b",
        lambda m: target.commit[: len(m.group(0))],
        ROLLED_NOTE.sub("", old),
    )
    new = f"{new} (rolled to {target.label} {target.commit[:12]})".strip()
    lines = recipe.path.read_text(encoding="utf-8").splitlines(keepends=True)
    doc = yamlconf.load(recipe.path)
    if (
        doc.get("description") is None
        or not old
        or old not in lines[doc.line_of("description") - 1]
    ):
        return f"unchanged (not one plain line in {recipe.path.name}): {old!r}"
    number = doc.line_of("description") - 1
    saved = lines[number]
    lines[number] = saved.replace(old, new, 1)
    recipe.path.write_text("".join(lines), encoding="utf-8")
    if yamlconf.load(recipe.path).get("description") != new:  # the new text needs quoting there
        lines[number] = saved
        recipe.path.write_text("".join(lines), encoding="utf-8")
        return f"unchanged (the new text would need quoting): {old!r}"
    return new


def _error_text(exc: KzError) -> str:
    return "\n".join(filter(None, (exc.message, exc.hint)))


def kz_tests(recipe: Recipe, plan: BumpPlan) -> list[str]:
    """The ``Kz-Test:`` of each patch that stays in the stack at the candidate, in series order."""
    live = {p.name for p in plan.check.patches if p.verdict in LIVE}
    return [
        t.value
        for patch in load_patches(recipe)
        if patch.name in live
        for t in patch.trailers
        if t.key == KZ_TEST
    ]


def run_kz_tests(
    project: Path, recipe: Recipe, plan: BumpPlan, environ: Mapping[str, str]
) -> RollStep:
    """pytest on the live patches' Kz-Test node ids, in the rolled project (so they see its
    recipes),
    slow ones included (``-m ''`` undoes the project's default deselection)."""
    names = kz_tests(recipe, plan)
    label = "the live patches' Kz-Test"
    if not names:
        return RollStep("tests", label, StepStatus.SKIPPED, "no live patch names a test")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "", *names]
    result = proc.run(
        argv, cwd=project, env=dict(environ), replace_env=True, check=False, timeout=TEST_TIMEOUT
    )
    tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
    status = StepStatus.PASSED if result.returncode == 0 else StepStatus.FAILED
    return RollStep("tests", f"{label}: {' '.join(names)}", status, tail)


def _plan_step(
    settings: Settings, recipe: Recipe, target_name: str, environ: Mapping[str, str]
) -> RollStep:
    label = f"plan the {target_name} build (--dry-run)"
    try:
        planned = builder.prepare(settings, recipe, target_name, environ=environ).plan
    except KzError as exc:
        return RollStep("plan", label, StepStatus.FAILED, _error_text(exc))
    detail = f"build id {planned.build_id}; steps: {', '.join(s.name for s in planned.steps)}"
    if planned.missing:
        detail += "; toolchains not available here: " + "; ".join(planned.missing)
    return RollStep("plan", label, StepStatus.PASSED, detail)


def _pin_artifact(
    settings: Settings, recipe: Recipe, environ: Mapping[str, str], progress: Progress | None
) -> Path:
    """The current pin built for the host, in a stage of its own (never the user's worktree)."""
    stage = Stage(settings, recipe, PIN_STAGE)
    try:
        staged = stage.create()
        return builder.build(
            builder.prepare(stage.settings, staged, HOST_TARGET, environ=environ), progress=None
        ).artifact.path
    finally:
        stage.remove()


def bench_ab(
    runner: ABRunner, pin: Path, candidate: Path, *, blocks: int, seed: int, threshold_pct: float
) -> BenchDelta:
    """The pin and the candidate benched in interleaved blocks; the candidate's median effect."""
    order = interleaved_order(["pin", "candidate"], blocks, seed)
    samples = runner.run({"pin": pin, "candidate": candidate}, order, seed)
    a, b = list(samples["pin"]), list(samples["candidate"])
    return BenchDelta(
        metric=runner.metric,
        order=tuple(name for block in order for name in block),
        pin=tuple(a),
        candidate=tuple(b),
        effect=median_effect(a, b, seed=seed, min_effect_pct=threshold_pct),
        spread_pin_pct=_spread(a),
        spread_candidate_pct=_spread(b),
        threshold_pct=threshold_pct,
        quality=tuple(runner.quality),
        memory_over=tuple(runner.memory_over.get("candidate", ())),
    )


def _spread(values: Sequence[float]) -> float:
    """(max - min) / median in percent, as bench records report it (0 for a single sample)."""
    return summarize(values).spread_pct or 0.0


# --- --write ---


def branch_name(commit: str) -> str:
    return BRANCH_PREFIX + commit[:7]


def _commit_branch(
    stage: Stage, commit: str, report: RollReport, notes: list[str]
) -> tuple[str | None, str | None]:
    """Commit the stage's recipes/ and patches/ and point ``kz/roll/<sha7>`` at it. When that
    branch exists: reused if its tree is the one made, else left alone (the notes say so)."""
    assert stage.repo is not None  # write_problem found none
    branch = branch_name(commit)
    git = Git(stage.project)
    # a folder neither in the stage nor tracked would fail git add
    staged = [d for d in STAGED_DIRS if (stage.project / d).exists() or git("ls-files", "--", d)]
    git("add", "-A", "--", *staged)
    message = commit_message(report)
    git(*NO_HOOKS, "commit", "-q", "--no-verify", "-F", "-", input=message, env=KZ_AUTHOR)
    made = git("rev-parse", "HEAD")
    existing = stage.repo.resolve(f"refs/heads/{branch}")
    if existing is None:
        git("branch", branch, made)
        return branch, made
    if git("rev-parse", f"{existing}^{{tree}}") == git("rev-parse", f"{made}^{{tree}}"):
        notes.append(
            f"the branch {branch} already holds this roll (commit {existing[:12]}): reused"
        )
        return branch, existing
    notes.append(
        f"not written: the branch {branch} exists with other content (compare: git diff "
        f"{branch} {made[:12]}; to replace it: git branch -D {branch}, then roll again)"
    )
    return None, None


# --- the report ---


def title(report: RollReport) -> str:
    rollable = report.rollable
    if rollable is not None:
        return (
            f"roll {report.recipe}: rollable to {rollable.candidate.label} "
            f"({rollable.candidate.commit[:12]})"
        )
    blocking = report.blocking
    if blocking is None and report.unchecked:
        sources = ", ".join(u.source for u in report.unchecked)
        pin = report.pin[:12]
        rest = f"nothing newer than the pin {pin} in the rest"
        return f"roll {report.recipe}: could not check {sources}; {rest}"
    if blocking is None:
        return f"roll {report.recipe}: nothing newer than the pin {report.pin[:12]}"
    return (
        f"roll {report.recipe}: not rollable; {blocking.candidate.label} "
        f"({blocking.candidate.commit[:12]}): {blocking.outcome.value}"
    )


def summary(report: RollReport) -> list[str]:
    """The report's gist: one line per candidate, the patches it would drop, who broke what."""
    lines = [f"- {u.describe()}" for u in report.unchecked]
    for result in report.results:
        lines.append(
            f"- {result.candidate.label} ({result.candidate.commit[:12]}): {result.outcome.value}"
        )
        for b in result.plan.bisects:
            lines.append(f"  - {b.patch}: {_culprit(b.culprit, b.reason)}")
    rollable = report.rollable
    if rollable is not None:
        drops = [f"{p.name} ({p.describe()})" for p in rollable.plan.check.upstreamed]
        lines.append("would drop as upstreamed: " + ("; ".join(drops) if drops else "none"))
    return lines


def commit_message(report: RollReport) -> str:
    rollable = report.rollable
    assert rollable is not None
    head = (
        f"{report.recipe}: roll upstream {report.pin[:12]} -> {rollable.candidate.commit[:12]} "
        f"({rollable.candidate.label})"
    )
    return head + "\n\n" + "\n".join(summary(report)) + "\n\nMade by kzbuild roll.\n"


def _culprit(culprit: UpstreamCommit | None, reason: str | None) -> str:
    if culprit is None:
        return reason or "no result"
    number = pr_number(culprit.subject)
    pr = f"PR #{number}" if number is not None else "no PR number in the subject"
    return (
        f'broken by {culprit.sha[:12]} "{culprit.subject}" ({pr}, {culprit.author}, {culprit.date})'
    )


def markdown(report: RollReport) -> str:
    out = [
        f"# {title(report)}",
        "",
        f"Pin `{report.pin[:12]}`; {len(report.results)} candidate(s), newest first.",
        "",
    ]
    out += summary(report)
    for note in report.notes:
        out.append(f"- note: {note}")
    if report.branch:
        out += ["", f"Written: branch `{report.branch}` (commit `{(report.commit or '')[:12]}`)."]
    for result in report.results:
        c = result.candidate
        check = result.plan.check
        out += ["", f"## {c.label} `{c.commit[:12]}`: {result.outcome.value}", ""]
        between = (
            f"{check.commits_between} upstream commits since the pin"
            if check.commits_between is not None
            else "commits since the pin unknown"
        )
        out += [f"{c.origin}, committed {c.date}; {between}; history {check.history}.", ""]
        out += ["| patch | verdict | detail |", "|---|---|---|"]
        for p in check.patches:
            out.append(f"| {p.name} | {p.verdict.value} | {_cell(p.describe())} |")
        for b in result.plan.bisects:
            out += [
                "",
                f"- **{b.patch}**: {_culprit(b.culprit, b.reason)}; {b.checks} apply check(s) over "
                f"{b.commits} commit(s)",
            ]
        if result.steps:
            out += ["", "| step | status | detail |", "|---|---|---|"]
            for s in result.steps:
                out.append(f"| {_cell(s.label)} | {s.status.value} | {_cell(s.detail)} |")
        for note in check.notes + result.plan.notes:
            out.append(f"\n- note: {note}")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")
