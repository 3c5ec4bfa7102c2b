"""``kzbuild patches ...`` (the patch stack) and ``kzbuild bump`` (move a recipe's pin).

The capability modules are imported inside the commands: every kzbuild start (a no-op sync
included) would otherwise pay for loading them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from kzbuild.adapters.settings import Settings
from kzbuild.cli.options import DEFAULT_RECIPE, JsonOpt, RecipeArg, load_recipe
from kzbuild.cli.ui import (
    Cell,
    activity,
    command_group,
    context,
    not_empty,
    print_json,
    say,
    say_rich_table,
    styled,
    write_out,
)
from kzbuild.errors import BuildFailed, PatchError
from kzbuild.source import recipes

if TYPE_CHECKING:
    from kzbuild.model.patch import Patch
    from kzbuild.model.recipe import Recipe
    from kzbuild.model.stack import Problem
    from kzbuild.model.stackcheck import BisectResult, ExportResult, StackCheck

patches_app = command_group(
    "patches",
    "The patch stack (patches/series): list, lint, check against upstream, export from the "
    "worktree, edit.",
)

HistoryOpt = Annotated[
    bool,
    typer.Option(
        "--fetch-history",
        help="Fetch the upstream history between the pin and the target from a git source, so "
        "patch-ids and commit counts can be used.",
    ),
]
SeriesOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--series", help="Series file (default: the --recipe's series, else patches/series)."
    ),
]
VERDICT_STYLE = {
    "clean": "green",
    "3way": "yellow",
    "conflict": "bold red",
    "upstreamed": "cyan",
    "empty": "magenta",
}


def register(app: typer.Typer) -> None:
    app.add_typer(patches_app)
    app.command("bump")(bump_command)


def _series_path(settings: Settings, series: Path | None, recipe: Recipe | None = None) -> Path:
    if series is None:
        series = recipe.series if recipe else settings.patches / "series"
    return series.resolve()


def _lint_files(
    settings: Settings, series: Path | None, recipe: str | None
) -> tuple[Recipe | None, list[Patch], list[Problem]]:
    """The recipe (when named), the series' patches, and what lint finds in the files alone."""
    from kzbuild.source.stack.patchfile import lint_series

    loaded = recipes.load_recipe(settings.project, recipe) if recipe else None
    patches, problems = lint_series(_series_path(settings, series, loaded))
    return loaded, patches, problems


def _shown(settings: Settings, path: Path) -> str:
    return (
        str(path.relative_to(settings.project))
        if path.is_relative_to(settings.project)
        else str(path)
    )


@patches_app.command("list")
def list_command(
    ctx: typer.Context,
    series: SeriesOpt = None,
    recipe: Annotated[
        Optional[str],
        typer.Option(
            callback=not_empty,
            help="List this recipe's series, and how its last sync used each patch.",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """The series in apply order: lint status, upstream status, files touched, lines added and
    removed."""
    from kzbuild.source.sync import read_lock

    settings = context(ctx).settings
    loaded, patches, problems = _lint_files(settings, series, recipe)
    synced = {}
    if loaded:
        lock = read_lock(loaded.lock_path)
        synced = (
            {
                p.file: (p.commit[:12] if p.commit else f"skipped: upstreamed ({p.upstreamed})")
                for p in lock.patches
            }
            if lock
            else {}
        )
    rows = []
    for patch in patches:
        mine = [p for p in problems if p.path == patch.path]
        rows.append(
            {
                "patch": patch.name,
                "subject": patch.subject,
                "status": "ok" if not mine else f"{len(mine)} lint problem(s)",
                "upstream_status": patch.upstream_status,
                "files": [f.path for f in patch.files],
                "added": patch.added,
                "removed": patch.removed,
                **({"synced": synced.get(patch.name, "not in the lock")} if recipe else {}),
            }
        )
    if json_out:
        print_json(rows)
        return
    if not rows:
        say("the series is empty")
        return
    cells: list[tuple[Cell, ...]] = []
    for row in rows:
        files = row["files"]
        assert isinstance(files, list)
        shown = ", ".join(files[:3]) + (f" +{len(files) - 3} more" if len(files) > 3 else "")
        cells.append(
            (
                (f"{row['patch']}\n", styled("dim", str(row["subject"]))),
                styled("green" if row["status"] == "ok" else "red", str(row["status"])),
                str(row["upstream_status"] or "-"),
                shown,
                f"+{row['added']} -{row['removed']}",
                *([str(row["synced"])] if recipe else []),
            )
        )
    say_rich_table(
        ("patch", "status", "upstream", "files", "+/-", *(["sync"] if recipe else [])), cells
    )


@patches_app.command("lint")
def lint_command(
    ctx: typer.Context,
    series: SeriesOpt = None,
    recipe: Annotated[
        Optional[str],
        typer.Option(
            callback=not_empty,
            help="Lint this recipe's series, and check that every patch applies exactly (no fuzz, "
            "no 3-way merge) at its pin.",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the series and every patch: trailers, series <-> files, CRLF damage, index lines,
    fuzz."""
    from kzbuild.source.stack.check import tree_problems

    settings = context(ctx).settings
    loaded, patches, problems = _lint_files(settings, series, recipe)
    if loaded and not problems:
        with activity(f"applying the stack at {loaded.upstream.commit[:12]}"):
            problems += tree_problems(settings, loaded, patches)
    _print_problems(settings, problems, json_out, checked=len(patches))
    if problems:
        raise PatchError(f"lint found {len(problems)} problem(s)")


def _print_problems(
    settings: Settings, problems: list[Problem], json_out: bool, *, checked: int
) -> None:
    if json_out:
        print_json([{"file": str(p.path), "line": p.line, "message": p.message} for p in problems])
        return
    for problem in problems:
        say(styled("red", problem.where(settings.project)), f": {problem.message}")
    if not problems:
        say(styled("green", "ok"), f": {checked} patch(es), no problems")


@patches_app.command("check")
def check_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    against: Annotated[
        Optional[str],
        typer.Option(
            "--against",
            callback=not_empty,
            help="Upstream commit to check against: sha, branch of the remote, or "
            "pypi:llama-cpp-python==X. Default: the pin.",
        ),
    ] = None,
    fetch_history: HistoryOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Apply the stack in a scratch repo and classify each patch: clean, 3way, conflict, upstreamed,
    empty."""
    from kzbuild.source.stack.check import check_stack

    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    with activity(f"checking {loaded.name}") as progress:
        report = check_stack(
            settings, loaded, against=against, fetch_history=fetch_history, progress=progress
        )
    if json_out:
        print_json({"recipe": loaded.name, **report.to_dict()})
    else:
        _print_check(report)
    if report.conflicts:
        raise PatchError(f"{len(report.conflicts)} patch(es) conflict with {report.target[:12]}")


def _print_check(report: StackCheck) -> None:
    say(f"upstream {report.target}")
    if report.since:
        between = (
            f"{report.commits_between} commits"
            if report.commits_between is not None
            else "unknown number of commits"
        )
        say(f"  since the pin {report.since[:12]}: {between}; history {report.history}")
    say_rich_table(
        ("patch", "result", "detail"),
        [
            (
                result.name,
                styled(VERDICT_STYLE[result.verdict.value], result.verdict.value),
                result.describe(),
            )
            for result in report.patches
        ],
    )
    for note in report.notes:
        say(styled("dim", note))


@patches_app.command("upstream")
def upstream_command(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(callback=not_empty, help="Patch file name as in the series.")
    ],
    recipe: Annotated[
        str,
        typer.Option("--recipe", callback=not_empty, help="Recipe whose series and pin to use."),
    ] = DEFAULT_RECIPE,
    against: Annotated[
        Optional[str],
        typer.Option(
            "--against",
            callback=not_empty,
            help="Also apply it alone at this upstream commit: sha, branch of the remote, or "
            "pypi:llama-cpp-python==X.",
        ),
    ] = None,
    no_build: Annotated[
        bool, typer.Option("--no-build", help="Skip building the pin plus this patch for the host.")
    ] = False,
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output",
            "-o",
            help="Write the patch as upstream receives it here (default: stdout, unless --json).",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """The patch as upstream would receive it (kzbuild's trailers stripped), applied alone at the
    pin (and --against), built for the host."""
    from kzbuild.build.upstreamcheck import check_upstream

    settings = context(ctx).settings
    loaded = recipes.load_recipe(settings.project, recipe)
    with activity(f"checking {name} alone") as progress:
        report = check_upstream(
            settings,
            loaded,
            name,
            against=(against,) if against else (),
            build=not no_build,
            environ=os.environ,
            progress=progress,
        )
    if output is not None:
        output.write_text(report.text, encoding="utf-8")
    if json_out:
        print_json({"recipe": loaded.name, **report.to_dict()})
    elif output is None:
        write_out(report.text)
    if not json_out:
        err = output is None  # stdout holds the mbox
        style = {"pass": "green", "fail": "bold red", "skipped": "yellow"}
        for step in report.steps:
            mark = style[step.status.value]
            say(styled(mark, step.status.value), f" {step.label}", err=err)
            if step.files and step.kind == "apply":  # a build step's files are in its detail
                say(f"  does not apply: {', '.join(step.files)}", err=err)
            if step.detail:
                say("\n".join(f"  {line}" for line in step.detail.splitlines()), err=err)
    failed = report.first_failure
    if failed is None:
        return
    if failed.kind == "build":
        raise BuildFailed(
            f"{report.patch}: cannot {failed.label} (its check shows the compiler's last lines)"
        )
    raise PatchError(
        f"{report.patch}: cannot {failed.label}: {', '.join(failed.files) or failed.detail}"
    )


@patches_app.command("export")
def export_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Overwrite (or remove) patch files that changed since this worktree was synced or "
            "exported.",
        ),
    ] = False,
) -> None:
    """Write the worktree's commits above the base back to patches/ and the series (byte-identical
    when unchanged)."""
    from kzbuild.source.stack.export import export

    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    result = export(settings, loaded, force=force)
    _print_export(result)


def _print_export(result: ExportResult) -> None:
    for name in result.added:
        say("  ", styled("green", "new"), f"        {name}")
    for name in result.written:
        why = "format normalized" if name in result.normalized else "changed"
        say("  ", styled("yellow", "rewritten"), f"  {name} ({why})")
    for name in result.removed:
        say("  ", styled("red", "removed"), f"    {name} (its commit is gone)")
    for note in result.notes:
        say("  ", styled("dim", note))
    if result.series_changed:
        say("  series updated")
    if not result.changed:
        say(f"nothing to export: {len(result.unchanged)} patch(es) unchanged")


@patches_app.command("new")
def new_command(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(callback=not_empty, help="File name for the patch (.patch is added).")
    ],
    recipe: RecipeArg = None,
    subject: Annotated[
        str,
        typer.Option(
            "--subject",
            "-m",
            callback=not_empty,
            help="The commit subject, like 'common: fix ...'.",
        ),
    ] = ...,  # type: ignore[assignment]
    test: Annotated[
        str,
        typer.Option("--test", callback=not_empty, help="Kz-Test: the test that proves the patch."),
    ] = ...,  # type: ignore[assignment]
    upstream_status: Annotated[
        str,
        typer.Option(
            callback=not_empty,
            help="Upstream-Status: Pending, Submitted <url>, Backport <sha|url>, Inappropriate "
            "<why>, Merged <sha>.",
        ),
    ] = "Pending",
    upstream_pr: Annotated[
        Optional[str], typer.Option(callback=not_empty, help="Upstream-PR: URL.")
    ] = None,
    drop_when: Annotated[
        Optional[str],
        typer.Option(
            callback=not_empty, help="Drop-When: upstream sha that makes the patch obsolete."
        ),
    ] = None,
    author: Annotated[
        Optional[str],
        typer.Option(callback=not_empty, help="'Name <email>' (default: your git identity)."),
    ] = None,
) -> None:
    """Make the worktree's uncommitted changes a new patch at the top of the stack, and export."""
    from kzbuild.source.stack.export import new_patch

    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    made, result = new_patch(
        settings,
        loaded,
        name,
        subject=subject,
        test=test,
        upstream_status=upstream_status,
        upstream_pr=upstream_pr,
        drop_when=drop_when,
        author=author,
    )
    say(styled("green", "created"), f" {_shown(settings, loaded.series.parent / made)}")
    _print_export(result)


@patches_app.command("drop")
def drop_command(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(callback=not_empty, help="Patch file name as in the series.")
    ],
    reason: Annotated[
        str,
        typer.Option(
            "--reason", callback=not_empty, help="Why it goes (kept in patches/DROPPED.yaml)."
        ),
    ] = ...,  # type: ignore[assignment]
    upstream: Annotated[
        Optional[str],
        typer.Option(callback=not_empty, help="Upstream commit that made it obsolete."),
    ] = None,
    series: SeriesOpt = None,
) -> None:
    """Remove a patch from the series and delete its file, recording why in patches/DROPPED.yaml."""
    from kzbuild.source.stack.patchfile import DROPPED_LOG, drop_patch

    settings = context(ctx).settings
    path = _series_path(settings, series)
    record = drop_patch(path, name, reason=reason, upstream=upstream)
    say(f"dropped {record.patch}; recorded in {_shown(settings, path.parent / DROPPED_LOG)}")


@patches_app.command("move")
def move_command(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(callback=not_empty, help="Patch file name as in the series.")
    ],
    before: Annotated[
        Optional[str],
        typer.Option("--before", callback=not_empty, help="Put it just before this patch."),
    ] = None,
    after: Annotated[
        Optional[str],
        typer.Option("--after", callback=not_empty, help="Put it just after this patch."),
    ] = None,
    series: SeriesOpt = None,
) -> None:
    """Move a patch in the series, keeping its comments; warns when it crosses a patch touching the
    same files."""
    from kzbuild.source.stack.patchfile import move_patch

    settings = context(ctx).settings
    overlapping = move_patch(_series_path(settings, series), name, before=before, after=after)
    say(f"moved {name} {'before ' + before if before else 'after ' + str(after)}")
    if overlapping:
        say(
            styled("yellow", "warning:"),
            f" it now crosses {', '.join(overlapping)}, which touch the same files; "
            "run 'kzbuild patches check' to see that the stack still applies",
        )


def bump_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            callback=not_empty,
            help="New upstream: sha, branch of the remote, or pypi:llama-cpp-python==X.",
        ),
    ] = ...,  # type: ignore[assignment]
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="Update the recipe's pin and lock (only when no patch conflicts); drop upstreamed "
            "patches with a record.",
        ),
    ] = False,
    bisect: Annotated[
        bool,
        typer.Option(
            "--bisect",
            help="For each conflicting patch, find the upstream commit that broke it (implies "
            "--fetch-history).",
        ),
    ] = False,
    fetch_history: HistoryOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Check the patch stack against a newer upstream commit, and move the recipe's pin there."""
    from kzbuild.source.stack import bump
    from kzbuild.source.stack.patchfile import DROPPED_LOG

    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    with activity(f"checking {loaded.name} against {to}") as progress:
        planned = bump.plan(
            settings, loaded, to, bisect=bisect, fetch_history=fetch_history, progress=progress
        )
    if json_out:
        print_json(planned.to_dict())
    else:
        say(
            f"{loaded.name}: {planned.old[:12]} -> {planned.target.commit[:12]} "
            f"({planned.target.label})"
        )
        _print_check(planned.check)
        for result in planned.bisects:
            _print_bisect(result)
        for note in planned.notes:
            say(styled("dim", note))
    if not write:
        if planned.check.conflicts:
            raise PatchError(
                f"{len(planned.check.conflicts)} patch(es) conflict with "
                f"{planned.target.commit[:12]}"
            )
        return
    with activity(f"bumping {loaded.name}") as progress:
        written = bump.write(settings, loaded, planned, progress=progress)
    if json_out:
        return
    say(
        styled("green", "bumped"), f" {_shown(settings, written.recipe)} to {planned.target.commit}"
    )
    for name in written.dropped:
        say(f"  dropped {name} (upstreamed); recorded in patches/{DROPPED_LOG}")
    for note in written.sync.notes + written.notes:
        say("  ", styled("dim", note))
    say(f"  synced; lock {_shown(settings, loaded.lock_path)} head {written.sync.lock.head[:12]}")


def _print_bisect(result: BisectResult) -> None:
    checks = f"{result.checks} apply check(s) over {result.commits} upstream commit(s)"
    if result.culprit is None:
        say(
            f"bisect {result.patch}: ",
            styled("yellow", result.reason or "no result"),
            f" ({checks})",
        )
        return
    culprit = result.culprit
    say(
        f"bisect {result.patch}: first fails at ",
        styled("bold", culprit.sha),
        f" ({checks})",
    )
    say(f"  {culprit.subject}")
    say(f"  {culprit.author}, {culprit.date}")
