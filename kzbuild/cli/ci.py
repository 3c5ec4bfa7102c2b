"""``kzbuild ci``."""

from __future__ import annotations

import os

import typer

from kzbuild.build import remotecache
from kzbuild.cli.build import ArtifactsOpt, JobsOpt, TargetOpt, ToolchainOpt
from kzbuild.cli.options import NoRemoteOpt, RecipeArg, append_step_summary, load_recipe
from kzbuild.cli.ui import build_progress, context, print_json, say, styled
from kzbuild.model.build import BuildOptions
from kzbuild.model.ci import CiStep


def register(app: typer.Typer) -> None:
    app.command("ci")(ci_command)


def ci_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    target: TargetOpt = None,
    toolchain: ToolchainOpt = None,
    jobs: JobsOpt = None,
    artifacts: ArtifactsOpt = None,
    no_remote_cache: NoRemoteOpt = False,
) -> int:
    """Sync, check the patches, build each target whose toolchain is here (others: skipped, with
    why); print a JSON summary.

    Targets given with --target must build; targets from the recipe are skipped when their toolchain
    is missing. v79-check (compilation only, no SDK) runs wherever it is asked for. Appends a
    markdown summary to $GITHUB_STEP_SUMMARY when it is set. Exits non-zero (the failing step's
    code) on any failure.
    """
    from kzbuild.ci import run_ci  # it loads every target's code; only ci needs that

    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)

    def announce(step: CiStep) -> None:
        colour = {"ok": "green", "failed": "red", "skipped": "yellow"}.get(step.status, "white")
        say(styled(colour, f"{step.status:7}"), f" {step.name}: {step.detail}", err=True)

    with build_progress(f"ci {loaded.name}") as progress:
        report = run_ci(
            settings,
            loaded,
            environ=os.environ,
            targets=target or (),
            options=BuildOptions(jobs=jobs, overrides=tuple(toolchain or ()), artifacts=artifacts),
            on_step=announce,
            progress=progress,
            remote=remotecache.load_config(settings, os.environ, disabled=no_remote_cache),
        )
    print_json(report.to_dict())
    append_step_summary(report.to_markdown())
    return report.exit_code
