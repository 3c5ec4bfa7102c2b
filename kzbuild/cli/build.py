"""``kzbuild build``, ``kzbuild doctor`` and ``kzbuild ci``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from kzbuild import build as builds
from kzbuild import proc, recipes, remotecache
from kzbuild.cli.complete import complete_device, complete_recipe
from kzbuild.cli.options import JsonOpt, NoRemoteOpt, RecipeArg, append_step_summary, load_recipe
from kzbuild.cli.ui import ProgressLines, console, context, err_console, not_empty, print_json
from kzbuild.devices.registry import resolve_device
from kzbuild.errors import ToolchainMissing
from kzbuild.model.build import V79_CHECK_DESCRIPTION, V79_CHECK_PROVES, V79_CHECK_TARGET, BuildEvent, BuildOptions, BuildPlan, BuildResult, DeviceCheck, TargetCheck
from kzbuild.model.ci import CiStep
from kzbuild.model.recipe import Recipe
from kzbuild.model.remotecache import RemoteConfig
from kzbuild.model.toolchain import Found
from kzbuild.settings import Settings

if TYPE_CHECKING:
    from kzbuild import v79check

TargetOpt = Annotated[Optional[list[str]], typer.Option("--target", "-t", help=f"Target: {', '.join([*builds.TARGETS, V79_CHECK_TARGET])} (repeatable). Default: the recipe's targets. {V79_CHECK_TARGET}: {V79_CHECK_DESCRIPTION}.")]
DoctorTargetOpt = Annotated[Optional[list[str]], typer.Option("--target", "-t", help=f"Target: {', '.join(builds.TARGETS)} (repeatable). Default: the recipe's targets. ({V79_CHECK_TARGET} needs only the ziglang package and ccache.)")]
ToolchainOpt = Annotated[Optional[list[str]], typer.Option("--toolchain", help="Use this toolchain instead of the target's one for the same role, e.g. host-clang or snapdragon-docker (repeatable).")]
JobsOpt = Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="Parallel compile jobs (default: number of CPUs).")]
ArtifactsOpt = Annotated[Optional[Path], typer.Option("--artifacts", help="Artifacts folder (default: WORK/artifacts).")]


def register(app: typer.Typer) -> None:
    app.command("build")(build_command)
    app.command("doctor")(doctor_command)
    app.command("ci")(ci_command)


def build_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    target: TargetOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Sync if needed, then print the exact commands and environment; run neither cmake nor ninja.")] = False,
    jobs: JobsOpt = None,
    toolchain: ToolchainOpt = None,
    tool: Annotated[Optional[list[str]], typer.Option("--tool", help="Build this tool too, e.g. llama-cli or llama-server, or kzbuild's kz-profile (repeatable).")] = None,
    artifacts: ArtifactsOpt = None,
    no_remote_cache: NoRemoteOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Build llama.cpp for a target into .kz/artifacts/<build-id>/ (bin/, lib/, manifest.json); reuse it when the id exists.

    --target v79-check needs no SDK: it compiles every HTP source of the synced tree for hexagonv79 (HVX 128B, -Wall -Werror) and the host backend for aarch64, with zig's clang against the stand-ins in kernels/hexagon-sdk/, into .kz/artifacts/v79-check-<id>/ (objects, manifest.json). It proves compilation only: no link, no run. A source that does not compile exits 7 naming the patches that change the files involved; an SDK name the stand-ins lack exits 6.

    With a remote cache (KZ_REMOTE_CACHE or .kz/config.yaml: redis:// or a WebDAV http:// URL) it first pulls the artifact of the build id from there, verified file by file against its manifest's sha256; else it compiles with ccache's remote storage and pushes the artifact after. A cache that is down or slow is a warning: the build goes on locally.
    """
    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    remote = remotecache.load_config(settings, os.environ, disabled=no_remote_cache)
    outputs = []
    options = BuildOptions(jobs=jobs, overrides=tuple(toolchain or ()), extra_tools=tuple(tool or ()), artifacts=artifacts)
    for name in target or list(loaded.build.targets):
        if name == V79_CHECK_TARGET:
            outputs.append(v79_check(settings, loaded, options, dry_run=dry_run, json_out=json_out))
            continue
        if dry_run:
            plan = builds.prepare(settings, loaded, name, environ=os.environ, options=options).plan
            outputs.append({**plan.to_dict(), "remote_cache": remote.to_dict() if remote else None})
            if not json_out:
                render_plan(plan, remote)
            continue
        with BuildDisplay(f"{loaded.name} → {name}") as display:
            prepared = builds.prepare(settings, loaded, name, environ=os.environ, options=options, progress=display.update)
            result = builds.build(prepared, progress=display.update, remote=remote, on_no_artifact=announce_expected_duration)
        outputs.append(result_dict(result))
        if not json_out:
            render_result(result)
    if json_out:
        print_json(outputs[0] if len(outputs) == 1 else outputs)


def v79_check(settings: Settings, recipe: Recipe, options: BuildOptions, *, dry_run: bool, json_out: bool) -> dict[str, object]:
    """--target v79-check: compile every Hexagon source without the SDK (kzbuild.v79check)."""
    from kzbuild import v79check

    if dry_run:
        plan = v79check.prepare_check(settings, recipe, options=options)
        if not json_out:
            console.print(f"[bold]plan[/bold] {recipe.name} → {v79check.TARGET}: build id [cyan]{plan.check_id}[/cyan] ({plan.build_commit})")
            console.print(f"  proves    {v79check.PROVES}", highlight=False)
            console.print(f"  source    {plan.source}\n  scratch   {plan.scratch}\n  artifact  {plan.artifact_dir}", highlight=False)
            console.print(f"  dsp flags  {' '.join(v79check.DSP_FLAGS)}\n  host flags {' '.join(v79check.HOST_FLAGS)}", highlight=False, markup=False)
        return plan.to_dict()
    with BuildDisplay(f"{recipe.name} → {v79check.TARGET}") as display:
        result = v79check.run_check(v79check.prepare_check(settings, recipe, options=options, progress=display.update), progress=display.update)
    if not json_out:
        render_check(result)
    return check_dict(result)


def check_dict(result: v79check.CheckResult) -> dict[str, object]:
    return {
        "build_id": result.artifact.build_id, "artifact": str(result.artifact.path), "target": V79_CHECK_TARGET,
        "proves": V79_CHECK_PROVES, "reused": result.reused, "compiled": result.compiled, "cached": result.cached,
        "host_warnings": result.warnings, "times": dict(result.times), "files": len(result.artifact.files),
    }


def render_check(result: v79check.CheckResult) -> None:
    artifact = result.artifact
    verb = "up to date" if result.reused else "checked"
    detail = "artifact exists; nothing compiled" if result.reused else (
        f"{result.compiled + result.cached} sources, {result.cached} from ccache, in {result.times.get('total_s', 0):.1f} s")
    console.print(f"[green]{verb}[/green] {artifact.build_id} ({detail}) → {artifact.path}", highlight=False)
    console.print(f"  proves {V79_CHECK_PROVES}", highlight=False)
    if result.warnings:
        console.print(f"  host side: {result.warnings} compiler warning(s) (the DSP side has -Werror)", highlight=False)


def announce_expected_duration(plan: BuildPlan) -> None:
    """Before a build that will run (its artifact is not there): how long the last one of its target took."""
    previous = builds.previous_build(plan.artifact_dir.parent, plan.target)
    if previous is None:
        err_console.print(f"building {plan.build_id}: no earlier {plan.target} build is recorded, so no expected duration", highlight=False, soft_wrap=True)
    else:
        err_console.print(
            f"building {plan.build_id}: expect about {previous.seconds:.0f} s after the sync "
            f"(the last {plan.target} build, {previous.build_id}, started {previous.started}, took that)",
            highlight=False,
            soft_wrap=True,
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
    console.print(f"[bold]plan[/bold] {plan.recipe} → {plan.target}: build id [cyan]{plan.build_id}[/cyan] ({plan.build_commit})")
    console.print(f"  source    {plan.source}")
    console.print(f"  build dir {plan.build_dir}")
    exists = (plan.artifact_dir / "manifest.json").is_file()
    console.print(f"  artifact  {plan.artifact_dir}" + ("  [green](exists: nothing to do)[/green]" if exists else ""))
    for name, info in plan.toolchains.items():
        console.print(f"  toolchain {name} {info.get('version') or ''}".rstrip())
    for problem in plan.missing:
        console.print(f"  [yellow]missing:[/yellow] {problem}", highlight=False)
    if remote is not None:
        layers = " and ".join(name for name, on in (("artifacts", remote.artifacts), ("ccache", remote.ccache)) if on) or "nothing"
        console.print(f"  remote    {escape(remote.shown)} ({layers}; set by {escape(remote.source)}); ccache gets it as CCACHE_REMOTE_STORAGE", highlight=False)
    for step in plan.steps:
        console.print(f"\n# {step.name}", style="bold", highlight=False)
        console.print(proc.describe(list(step.argv), step.cwd, dict(step.env) or None), highlight=False, soft_wrap=True, markup=False)


def render_result(result: BuildResult) -> None:
    artifact = result.artifact
    remote = result.remote
    if remote is not None and remote.pulled:
        console.print(f"[green]pulled[/green] {artifact.build_id} from {escape(remote.store)} in {remote.seconds:.1f} s "
                      f"({remote.downloaded_bytes / 1e6:.1f} MB, every file checked against its sha256; nothing compiled) → {artifact.path}", highlight=False)
        return
    if result.reused:
        console.print(f"[green]up to date[/green] {artifact.build_id} (artifact exists; cmake not run) → {artifact.path}")
        return
    times = result.times
    console.print(
        f"[green]built[/green] {artifact.build_id} in {times.get('total_s', 0):.1f} s "
        f"(sync {times.get('sync_s', 0):.1f}, configure {times.get('configure_s', 0):.1f}, ninja {times.get('build_s', 0):.1f}) → {artifact.path}"
    )
    if result.ccache is not None and result.ccache.hit_rate is not None:
        stats = result.ccache
        console.print(f"  ccache {stats.hit_rate:.0%} hits ({stats.hits}/{stats.hits + stats.misses} compiles: "
                      f"{stats.hits - stats.remote_hits} local, {stats.remote_hits} remote)")
    else:
        console.print("  ccache: no compiles logged (nothing needed compiling)")
    console.print(f"  {len(artifact.tools)} tools, {len(artifact.libs)} libraries; build commit {artifact.build_commit}; log {result.plan.log}")
    if remote is not None and remote.pushed:
        console.print(f"  pushed to {escape(remote.store)} ({remote.uploaded_bytes / 1e6:.1f} MB sent)", highlight=False)


class BuildDisplay:
    """A live progress bar fed by ninja's [n/N] lines; in logs and pipes, ProgressLines."""

    def __init__(self, title: str) -> None:
        self.title = title
        # imported here: rich.progress costs every command that loads this module ~30 ms otherwise
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.lines = None if err_console.is_terminal else ProgressLines(title)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("[dim]{task.fields[line]}"), console=err_console, transient=True,
        )
        self.task = self.progress.add_task(f"{title}: sync", total=None, line="")

    def __enter__(self) -> BuildDisplay:
        if self.lines:
            self.lines.__enter__()
        else:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lines:
            self.lines.__exit__(*exc)
        else:
            self.progress.stop()

    def update(self, event: BuildEvent) -> None:
        if self.lines:
            self.lines.update(event.stage, f"[{event.done}/{event.total}]" if event.total else "")
            return
        line = event.line.strip()[-70:]
        if event.total:
            self.progress.update(self.task, description=f"{self.title}: {event.stage}", total=event.total, completed=event.done or 0, line=line)
        else:
            self.progress.update(self.task, description=f"{self.title}: {event.stage}", line=line)


DoctorRecipeArg = Annotated[Optional[str], typer.Argument(callback=not_empty, help="Recipe whose targets and device to check. Default: no recipe: every target, no device.", autocompletion=complete_recipe)]


def doctor_command(
    ctx: typer.Context,
    recipe: DoctorRecipeArg = None,
    target: DoctorTargetOpt = None,
    toolchain: ToolchainOpt = None,
    device: Annotated[Optional[str], typer.Option("--device", "-d", callback=not_empty, help="Also check that this device answers (default: the recipe's device).", autocompletion=complete_device)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the toolchains, cmake, ninja and ccache a target needs, naming the file that proved each version.

    With no arguments it checks every target and no device, and only reports (exit 0).

    With a recipe (or --device) it also checks that the device answers: an adb device must be online in an adb server that is already running (doctor starts none); an ssh device must accept a login whose host key matches known_hosts; a local device's runner must be on PATH.

    Exits 6 when a target or device that was asked for (a recipe, --target or --device) is not ready.
    """
    settings = context(ctx).settings
    needed_by = None
    device_spec = device
    if recipe:
        loaded = recipes.load_recipe(settings.project, recipe)
        names = list(target or loaded.build.targets)
        needed_by = f"recipe {loaded.name}"
        device_spec = device or loaded.device
    else:
        names = list(target or builds.TARGETS)
    resolved = resolve_device(settings, device_spec) if device_spec else None
    report = builds.doctor(settings, names, environ=os.environ, overrides=toolchain or (), needed_by=needed_by, device=resolved)
    if json_out:
        print_json(report.to_dict())
    else:
        for check in report.targets:
            render_target_check(check)
        if report.device is not None:
            render_device_check(report.device)
    if not report.ok and (recipe or target or device):
        not_ready = ", ".join([t.target for t in report.targets if not t.ok] + ([f"device {report.device.device}"] if report.device and not report.device.ok else []))
        raise ToolchainMissing(f"not ready to build: {not_ready}", hint="install what is marked missing or not ok above, or point kzbuild at it (toolchains/README.md); a device's own hint is above")


def render_device_check(check: DeviceCheck) -> None:
    state = "[green]ok[/green]" if check.ok else "[red]not ok[/red]"
    console.print(f"[bold]device[/bold] {escape(check.device)} ({check.transport}): {state}: {escape(check.detail)}", highlight=False)
    if check.hint:
        console.print(f"  [yellow]hint:[/yellow] {escape(check.hint)}", highlight=False)


def render_target_check(check: TargetCheck) -> None:
    state = "[green]ready[/green]" if check.ok else "[red]not ready[/red]"
    console.print(f"[bold]{check.target}[/bold] ({builds.TARGETS[check.target].description}): {state}")
    from rich.table import Table

    table = Table(box=None, show_header=True, padding=(0, 2))
    for column in ("toolchain", "status", "version", "proven by"):
        table.add_column(column)
    for found in check.required:
        table.add_row(*toolchain_row(found, optional=False))
    for found in check.optional:
        table.add_row(*toolchain_row(found, optional=True))
    console.print(table)
    for found in [*check.required, *check.optional]:
        for problem in found.problems:
            colour = "dim" if found in check.optional else "red"
            console.print(f"  [{colour}]{found.name}: {problem}[/{colour}]", highlight=False)
        for note in found.notes:
            console.print(f"  [dim]{found.name}: {note}[/dim]", highlight=False)
    console.print()


def toolchain_row(found: Found, *, optional: bool) -> tuple[str, str, str, str]:
    if found.ok:
        status = "[green]ok[/green]" + (" (optional)" if optional else "")
    else:
        status = "[dim]absent (optional)[/dim]" if optional else "[red]missing[/red]"
    versions = ", ".join(f"{label} {version}" for label, version in found.versions) or (found.version or "")
    return found.name, status, versions, found.proof or ""


def ci_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    target: TargetOpt = None,
    toolchain: ToolchainOpt = None,
    jobs: JobsOpt = None,
    artifacts: ArtifactsOpt = None,
    no_remote_cache: NoRemoteOpt = False,
) -> int:
    """Sync, check the patches, build each target whose toolchain is here (others: skipped, with why); print a JSON summary.

    Targets given with --target must build; targets from the recipe are skipped when their toolchain is missing. v79-check (compilation only, no SDK) runs wherever it is asked for. Appends a markdown summary to $GITHUB_STEP_SUMMARY when it is set. Exits non-zero (the failing step's code) on any failure.
    """
    from kzbuild.ci import run_ci  # it loads every target's code; only ci needs that

    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)

    def announce(step: CiStep) -> None:
        colour = {"ok": "green", "failed": "red", "skipped": "yellow"}.get(step.status, "white")
        err_console.print(f"[{colour}]{step.status:7}[/{colour}] {step.name}: {step.detail}", highlight=False)

    with BuildDisplay(f"ci {loaded.name}") as display:
        report = run_ci(
            settings, loaded, environ=os.environ, targets=target or (),
            options=BuildOptions(jobs=jobs, overrides=tuple(toolchain or ()), artifacts=artifacts),
            on_step=announce, progress=display.update, remote=remotecache.load_config(settings, os.environ, disabled=no_remote_cache),
        )
    print_json(report.to_dict())
    append_step_summary(report.to_markdown())
    return report.exit_code
