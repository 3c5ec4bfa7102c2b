"""``kzbuild build``, and the build options ``kzbuild ci`` and ``kzbuild doctor`` share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from kzbuild.adapters import proc
from kzbuild.adapters.settings import Settings
from kzbuild.build import builder, remotecache
from kzbuild.cli.complete import complete_target
from kzbuild.cli.options import JsonOpt, NoRemoteOpt, RecipeArg, load_recipe
from kzbuild.cli.ui import build_progress, context, print_json, say, styled
from kzbuild.model.build import (
    V79_CHECK_DESCRIPTION,
    V79_CHECK_PROVES,
    V79_CHECK_TARGET,
    BuildOptions,
    BuildPlan,
    BuildResult,
)
from kzbuild.model.recipe import Recipe
from kzbuild.model.remotecache import RemoteConfig

if TYPE_CHECKING:
    from kzbuild.build import v79check

TargetOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--target",
        "-t",
        autocompletion=complete_target,
        help=f"Target: {', '.join(builder.BUILD_TARGETS)} (repeatable). Default: the recipe's "
        "targets. "
        f"{V79_CHECK_TARGET}: {V79_CHECK_DESCRIPTION}.",
    ),
]
ToolchainOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--toolchain",
        help="Use this toolchain instead of the target's one for the same role, e.g. host-clang or "
        "snapdragon-docker (repeatable).",
    ),
]
JobsOpt = Annotated[
    Optional[int],
    typer.Option("--jobs", "-j", min=1, help="Parallel compile jobs (default: number of CPUs)."),
]
ArtifactsOpt = Annotated[
    Optional[Path], typer.Option("--artifacts", help="Artifacts folder (default: WORK/artifacts).")
]


def register(app: typer.Typer) -> None:
    app.command("build")(build_command)


def build_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    target: TargetOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Sync if needed, then print the exact commands and environment; run neither cmake "
            "nor ninja.",
        ),
    ] = False,
    jobs: JobsOpt = None,
    toolchain: ToolchainOpt = None,
    tool: Annotated[
        Optional[list[str]],
        typer.Option(
            "--tool",
            help="Build this tool too, e.g. llama-cli or llama-server, or kzbuild's kz-profile "
            "(repeatable).",
        ),
    ] = None,
    artifacts: ArtifactsOpt = None,
    no_remote_cache: NoRemoteOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Build llama.cpp for a target into .kz/artifacts/<build-id>/ (bin/, lib/, manifest.json);
    reuse it when the id exists.

    --target v79-check needs no SDK: it compiles every HTP source of the synced tree for hexagonv79
    (HVX 128B, -Wall -Werror) and the host backend for aarch64, with zig's clang against the
    stand-ins in kernels/hexagon-sdk/, into .kz/artifacts/v79-check-<id>/ (objects, manifest.json).
    It proves compilation only: no link, no run. A source that does not compile exits 7 naming the
    patches that change the files involved; an SDK name the stand-ins lack exits 6.

    With a remote cache (KZ_REMOTE_CACHE or .kz/config.yaml: redis:// or a WebDAV http:// URL) it
    first pulls the artifact of the build id from there, verified file by file against its
    manifest's sha256; else it compiles with ccache's remote storage and pushes the artifact after.
    A cache that is down or slow is a warning: the build goes on locally.
    """
    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    remote = remotecache.load_config(settings, os.environ, disabled=no_remote_cache)
    outputs = []
    options = BuildOptions(
        jobs=jobs,
        overrides=tuple(toolchain or ()),
        extra_tools=tuple(tool or ()),
        artifacts=artifacts,
    )
    names = target or list(loaded.build.targets)
    builder.check_build_targets(names)
    for name in names:
        if name == V79_CHECK_TARGET:
            outputs.append(v79_check(settings, loaded, options, dry_run=dry_run, json_out=json_out))
            continue
        if dry_run:
            plan = builder.prepare(settings, loaded, name, environ=os.environ, options=options).plan
            outputs.append({**plan.to_dict(), "remote_cache": remote.to_dict() if remote else None})
            if not json_out:
                render_plan(plan, remote)
            continue
        with build_progress(f"{loaded.name} → {name}") as progress:
            prepared = builder.prepare(
                settings, loaded, name, environ=os.environ, options=options, progress=progress
            )
            result = builder.build(
                prepared,
                progress=progress,
                remote=remote,
                on_no_artifact=announce_expected_duration,
            )
        outputs.append(result_dict(result))
        if not json_out:
            render_result(result)
    if json_out:
        print_json(outputs[0] if len(outputs) == 1 else outputs)


def v79_check(
    settings: Settings, recipe: Recipe, options: BuildOptions, *, dry_run: bool, json_out: bool
) -> dict[str, object]:
    """--target v79-check: compile every Hexagon source without the SDK (kzbuild.build.v79check)."""
    from kzbuild.build import v79check

    if dry_run:
        plan = v79check.prepare_check(settings, recipe, options=options)
        if not json_out:
            say(
                styled("bold", "plan"),
                f" {recipe.name} → {v79check.TARGET}: build id ",
                styled("cyan", plan.check_id),
                f" ({plan.build_commit})",
            )
            say(f"  proves    {v79check.PROVES}")
            say(
                f"  source    {plan.source}\n  scratch   {plan.scratch}\n  artifact  "
                f"{plan.artifact_dir}"
            )
            say(
                f"  dsp flags  {' '.join(v79check.DSP_FLAGS)}\n  host flags "
                f"{' '.join(v79check.HOST_FLAGS)}"
            )
        return plan.to_dict()
    with build_progress(f"{recipe.name} → {v79check.TARGET}") as progress:
        result = v79check.run_check(
            v79check.prepare_check(settings, recipe, options=options, progress=progress),
            progress=progress,
        )
    if not json_out:
        render_check(result)
    return check_dict(result)


def check_dict(result: v79check.CheckResult) -> dict[str, object]:
    return {
        "build_id": result.artifact.build_id,
        "artifact": str(result.artifact.path),
        "target": V79_CHECK_TARGET,
        "proves": V79_CHECK_PROVES,
        "reused": result.reused,
        "compiled": result.compiled,
        "cached": result.cached,
        "host_warnings": result.warnings,
        "times": dict(result.times),
        "files": len(result.artifact.files),
    }


def render_check(result: v79check.CheckResult) -> None:
    artifact = result.artifact
    verb = "up to date" if result.reused else "checked"
    detail = (
        "artifact exists; nothing compiled"
        if result.reused
        else (
            f"{result.compiled + result.cached} sources, {result.cached} from ccache, in "
            f"{result.times.get('total_s', 0):.1f} s"
        )
    )
    say(styled("green", verb), f" {artifact.build_id} ({detail}) → {artifact.path}")
    say(f"  proves {V79_CHECK_PROVES}")
    if result.warnings:
        say(f"  host side: {result.warnings} compiler warning(s) (the DSP side has -Werror)")


def announce_expected_duration(plan: BuildPlan) -> None:
    """Before a build that will run (its artifact is not there): how long the last one of its target
    took."""
    previous = builder.previous_build(plan.artifact_dir.parent, plan.target)
    if previous is None:
        say(
            f"building {plan.build_id}: no earlier {plan.target} build is recorded, so no expected "
            "duration",
            err=True,
        )
    else:
        say(
            f"building {plan.build_id}: expect about {previous.seconds:.0f} s after the sync "
            f"(the last {plan.target} build, {previous.build_id}, started {previous.started}, took "
            "that)",
            err=True,
        )


def result_dict(result: BuildResult) -> dict[str, object]:
    return {
        "build_id": result.artifact.build_id,
        "artifact": str(result.artifact.path),
        "build_commit": result.artifact.build_commit,
        "reused": result.reused,
        "ccache": result.ccache.to_dict() if result.ccache else None,
        "times": dict(result.times),
        "remote": result.remote.to_dict() if result.remote else None,
        "files": len(result.artifact.files),
        "log": str(result.plan.log),
    }


def render_plan(plan: BuildPlan, remote: RemoteConfig | None = None) -> None:
    say(
        styled("bold", "plan"),
        f" {plan.recipe} → {plan.target}: build id ",
        styled("cyan", plan.build_id),
        f" ({plan.build_commit})",
    )
    say(f"  source    {plan.source}")
    say(f"  build dir {plan.build_dir}")
    exists = (plan.artifact_dir / "manifest.json").is_file()
    say(
        f"  artifact  {plan.artifact_dir}",
        *(("  ", styled("green", "(exists: nothing to do)")) if exists else ()),
    )
    for name, info in plan.toolchains.items():
        say(f"  toolchain {name} {info.get('version') or ''}".rstrip())
    for problem in plan.missing:
        say("  ", styled("yellow", "missing:"), f" {problem}")
    if remote is not None:
        layers = (
            " and ".join(
                name
                for name, on in (("artifacts", remote.artifacts), ("ccache", remote.ccache))
                if on
            )
            or "nothing"
        )
        say(
            f"  remote    {remote.shown} ({layers}; set by {remote.source}); ccache gets it as "
            "CCACHE_REMOTE_STORAGE"
        )
    for step in plan.steps:
        say("")
        say(styled("bold", f"# {step.name}"))
        say(proc.describe(list(step.argv), step.cwd, dict(step.env) or None))


def render_result(result: BuildResult) -> None:
    artifact = result.artifact
    remote = result.remote
    if remote is not None and remote.pulled:
        say(
            styled("green", "pulled"),
            f" {artifact.build_id} from {remote.store} in {remote.seconds:.1f} s "
            f"({remote.downloaded_bytes / 1e6:.1f} MB, every file checked against its sha256; "
            f"nothing compiled) → {artifact.path}",
        )
        return
    if result.reused:
        say(
            styled("green", "up to date"),
            f" {artifact.build_id} (artifact exists; cmake not run) → {artifact.path}",
        )
        return
    times = result.times
    say(
        styled("green", "built"),
        f" {artifact.build_id} in {times.get('total_s', 0):.1f} s "
        f"(sync {times.get('sync_s', 0):.1f}, configure {times.get('configure_s', 0):.1f}, ninja "
        f"{times.get('build_s', 0):.1f}) → {artifact.path}",
    )
    if result.ccache is not None and result.ccache.hit_rate is not None:
        stats = result.ccache
        say(
            f"  ccache {stats.hit_rate:.0%} hits ({stats.hits}/{stats.hits + stats.misses} "
            "compiles: "
            f"{stats.hits - stats.remote_hits} local, {stats.remote_hits} remote)"
        )
    else:
        say("  ccache: no compiles logged (nothing needed compiling)")
    say(
        f"  {len(artifact.tools)} tools, {len(artifact.libs)} libraries; build commit "
        f"{artifact.build_commit}; log {result.plan.log}"
    )
    if remote is not None and remote.pushed:
        say(f"  pushed to {remote.store} ({remote.uploaded_bytes / 1e6:.1f} MB sent)")
