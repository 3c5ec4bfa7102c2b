"""``kzbuild ci``: sync, check the stack, build every target that can be built here, summarise.

Targets named on the command line must build: a missing toolchain fails them. Targets taken
from the recipe are skipped, with the reason, when their toolchains are not here (a laptop
without the Hexagon SDK still checks the host build). The summary is JSON for machines and
markdown for ``$GITHUB_STEP_SUMMARY``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from kzbuild.adapters.settings import Settings
from kzbuild.build import builder, v79check
from kzbuild.build.toolchains import Detector
from kzbuild.errors import KzError
from kzbuild.model.build import BuildOptions
from kzbuild.model.ci import CiReport, CiStep
from kzbuild.model.recipe import Recipe
from kzbuild.model.remotecache import RemoteConfig
from kzbuild.source.sync import sync

Report = Callable[[CiStep], None]


def run_ci(
    settings: Settings,
    recipe: Recipe,
    *,
    environ: Mapping[str, str],
    targets: Sequence[str] = (),
    options: BuildOptions = BuildOptions(),
    on_step: Report | None = None,
    progress: builder.BuildProgress | None = None,
    remote: RemoteConfig | None = None,
) -> CiReport:
    steps: list[CiStep] = []

    def record(step: CiStep) -> CiStep:
        steps.append(step)
        if on_step:
            on_step(step)
        return step

    explicit = bool(targets)
    wanted = list(targets) or list(recipe.build.targets)
    builder.check_build_targets(wanted)

    started = time.monotonic()
    try:
        synced = sync(settings, recipe)
    except KzError as exc:
        record(CiStep("sync", "failed", exc.message, time.monotonic() - started, exc.exit_code))
        for name in wanted:
            record(CiStep(f"build:{name}", "skipped", "sync failed"))
        return CiReport(recipe.name, tuple(steps))
    lock = synced.lock
    record(
        CiStep(
            "sync",
            "ok",
            f"upstream {lock.upstream_commit[:12]}, head {lock.head[:12]}"
            + (" (changed)" if synced.changed else " (up to date)"),
            time.monotonic() - started,
        )
    )
    record(check_patches(settings, recipe))

    detector = Detector.for_settings(settings, environ)
    for name in wanted:
        if name == v79check.TARGET:
            record(_check_v79(settings, recipe, options, progress))
        else:
            record(
                _build_target(
                    settings, recipe, name, detector, explicit, environ, options, progress, remote
                )
            )
    return CiReport(recipe.name, tuple(steps))


def check_patches(settings: Settings, recipe: Recipe) -> CiStep:
    """``kzbuild patches check`` against the pin: a conflict fails; 3-way merges and upstreamed
    patches are named."""
    from kzbuild.errors import PatchError
    from kzbuild.source.stack.check import check_stack  # loaded only when needed (start-up time)

    started = time.monotonic()
    try:
        report = check_stack(settings, recipe)
    except KzError as exc:
        return CiStep("patches", "failed", exc.message, time.monotonic() - started, exc.exit_code)
    counts = Counter(p.verdict.value for p in report.patches)
    detail = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items())) or "no patches"
    remarks = [
        f"{p.name}: {p.verdict.value} ({p.describe()})"
        for p in report.patches
        if p.verdict.value != "clean"
    ]
    if remarks:
        detail += "; " + "; ".join(remarks)
    seconds = time.monotonic() - started
    if report.conflicts:
        return CiStep("patches", "failed", detail, seconds, PatchError.exit_code)
    return CiStep("patches", "ok", detail, seconds)


def _build_target(
    settings: Settings,
    recipe: Recipe,
    name: str,
    detector: Detector,
    explicit: bool,
    environ: Mapping[str, str],
    options: BuildOptions,
    progress: builder.BuildProgress | None,
    remote: RemoteConfig | None,
) -> CiStep:
    step = f"build:{name}"
    required, _ = builder.detect_for(
        builder.target(name), options.overrides, detector, f"recipe {recipe.name}"
    )
    missing = [problem for found in required if not found.ok for problem in found.problems[:1]]
    if missing and not explicit:
        return CiStep(step, "skipped", "toolchain not here: " + "; ".join(missing))
    started = time.monotonic()
    try:
        result = builder.build(
            builder.prepare(
                settings, recipe, name, environ=environ, options=options, progress=progress
            ),
            progress=progress,
            remote=remote,
        )
    except KzError as exc:
        return CiStep(
            step,
            "failed",
            exc.message + (f" ({exc.hint})" if exc.hint else ""),
            time.monotonic() - started,
            exc.exit_code,
        )
    rate = result.ccache.hit_rate if result.ccache else None
    detail = f"{result.artifact.build_id}" + (
        " (pulled from the remote cache)"
        if result.remote and result.remote.pulled
        else " (reused)"
        if result.reused
        else ""
    )
    if rate is not None:
        detail += f", ccache {rate:.0%} hits"
    return CiStep(
        step,
        "ok",
        detail,
        time.monotonic() - started,
        data={
            "build_id": result.artifact.build_id,
            "artifact": str(result.artifact.path),
            "reused": result.reused,
            "ccache": result.ccache.to_dict() if result.ccache else None,
            "remote": result.remote.to_dict() if result.remote else None,
        },
    )


def _check_v79(
    settings: Settings,
    recipe: Recipe,
    options: BuildOptions,
    progress: builder.BuildProgress | None,
) -> CiStep:
    """The v79 compile check: needs no SDK, so it runs (and must pass) wherever it is asked for."""
    step = f"build:{v79check.TARGET}"
    started = time.monotonic()
    try:
        result = v79check.run_check(
            v79check.prepare_check(settings, recipe, options=options, progress=progress),
            progress=progress,
        )
    except KzError as exc:
        return CiStep(
            step,
            "failed",
            exc.message + (f" ({exc.hint})" if exc.hint else ""),
            time.monotonic() - started,
            exc.exit_code,
        )
    detail = f"{result.artifact.build_id}" + (
        " (reused)"
        if result.reused
        else f", {result.cached} of {result.compiled + result.cached} from ccache"
    )
    return CiStep(
        step,
        "ok",
        f"{detail}; proves {v79check.PROVES}",
        time.monotonic() - started,
        data={
            "build_id": result.artifact.build_id,
            "artifact": str(result.artifact.path),
            "reused": result.reused,
        },
    )
