"""``kzbuild roll``: try newer upstream, say who broke which patch, find the newest candidate that
rolls."""

from __future__ import annotations

import os
from contextlib import ExitStack, closing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from kzbuild.adapters.files import write_atomic
from kzbuild.cli.options import (
    DeviceOpt,
    JsonOpt,
    RecipeArg,
    TrustOpt,
    WaitOpt,
    append_step_summary,
    load_recipe,
)
from kzbuild.cli.ui import activity, context, not_empty, print_json, say, styled
from kzbuild.errors import (
    BuildFailed,
    OverMemoryBudget,
    PatchError,
    RegressionFound,
    SourceError,
    WorktreeError,
    WrongOutput,
)
from kzbuild.model.request import RollArgs
from kzbuild.model.roll import DEFAULT_LIMIT, DEFAULT_THRESHOLD_PCT, PLAN_TARGET

if TYPE_CHECKING:
    from kzbuild.model.roll import RollReport


def register(app: typer.Typer) -> None:
    app.command("roll")(roll_command)


def roll_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    to: Annotated[
        Optional[list[str]],
        typer.Option(
            "--to",
            help="A candidate (repeatable): sha, branch or tag of a git source, or "
            "pypi:llama-cpp-python==X. Default: the default branch's head and newest tags of "
            "each git source, and the newer versions on the index of each pypi-sdist source.",
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            min=1,
            help="Without --to: at most this many tags, and this many versions, of each source.",
        ),
    ] = DEFAULT_LIMIT,
    device: DeviceOpt = None,
    bench_plan: Annotated[
        Optional[Path],
        typer.Option(
            "--plan",
            help="With --device: the experiment plan (plans/*.yaml, as kzbuild ab takes) whose "
            "model, first llama-bench run, blocks and seed bench the pin against the candidate "
            "(and whose quality: checks the candidate's output).",
        ),
    ] = None,
    trust_new_host: TrustOpt = False,
    wait: WaitOpt = 0.0,
    plan_target: Annotated[
        str,
        typer.Option(
            "--plan-target",
            callback=not_empty,
            help="The target whose build plan (--dry-run) each rolled candidate must produce; "
            "'none' skips it.",
        ),
    ] = PLAN_TARGET,
    no_build: Annotated[
        bool, typer.Option("--no-build", help="Skip the host build (the report says so).")
    ] = False,
    no_tests: Annotated[
        bool,
        typer.Option(
            "--no-tests", help="Skip running the live patches' Kz-Test (the report says so)."
        ),
    ] = False,
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            min=0,
            help="With --device: the candidate's median may fall this many percent "
            "below the pin's.",
        ),
    ] = DEFAULT_THRESHOLD_PCT,
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="Put the rollable candidate's pin, lock and dropped patches (DROPPED.yaml) on the "
            "branch kz/roll/<sha7> of the project repo, one commit carrying the report's "
            "summary. Changes nothing when no candidate is rollable.",
        ),
    ] = False,
    report_path: Annotated[
        Optional[Path],
        typer.Option(
            "--report",
            help="Write the markdown report here (also appended to $GITHUB_STEP_SUMMARY when that "
            "is set).",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Try newer upstream commits: verdict per patch, who broke each conflict (PR, author, date),
    build, Kz-Tests, v79 plan; the newest that passes is rollable.

    Exit codes: 0 a candidate is rollable (or rolled with --write, or nothing is newer; an existing
    kz/roll/<sha7> branch holding the same roll is reused); 4 --write could not write the rollable
    candidate: the project is not a git repository, its recipes/ or patches/ have uncommitted
    changes, or kz/roll/<sha7> exists with other content; 5 the newest candidate conflicts, or a
    live patch's Kz-Test fails there; 7 its build or plan fails; 9 its bench regressed past
    --threshold; 3 otherwise, when a source could not be checked (its host or index did not answer:
    newer upstream may be there); 17 its output is past the plan's quality limits (quality:, against
    the pin's logits on the CPU); 15 a run of it is past the plan's memory_budget or
    htp_session_limit; 10 another roll of the recipe holds its stage; 130 interrupted
    (Ctrl-C, SIGTERM, SIGHUP: the stage is removed first). The report is written in every case.
    """
    from kzbuild.measure import roll
    from kzbuild.measure.request import resolve_roll

    if (bench_plan is None) != (device is None):
        raise typer.BadParameter(
            "--device and --plan go together: the plan names the model and the llama-bench run to "
            "bench on the device",
            param_hint="'--device' / '--plan'",
        )
    if any(not ref.strip() for ref in to or ()):
        raise typer.BadParameter("must not be empty", param_hint="'--to'")
    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    request = resolve_roll(
        RollArgs(plan_file=bench_plan, to=tuple(to or ()), plan_target=plan_target)
    )
    with ExitStack() as open_things:
        bench = None
        if (plan := request.plan) is not None:
            # the device and bench modules load only for a roll that benches
            from kzbuild.cli.connect import open_device
            from kzbuild.measure import plans, resultsdb
            from kzbuild.measure.rolldevice import DeviceRunner

            found, transport = open_device(settings, device, None, trust_new_host)
            open_things.enter_context(closing(transport))
            store = open_things.enter_context(resultsdb.ResultsStore(settings.results))
            plans.check_model(plan, transport, found)
            bench = DeviceRunner(
                settings,
                transport,
                found,
                plan.runs[0].spec,
                store,
                wait=wait,
                quality_spec=plan.quality,
            )
        with activity(f"rolling {loaded.name}") as progress:
            report = roll.roll(
                settings,
                loaded,
                to=request.to,
                limit=limit,
                build=not no_build,
                tests=not no_tests,
                plan_target=request.plan_target,
                bench=bench,
                blocks=request.blocks,
                seed=request.seed,
                threshold_pct=threshold,
                write=write,
                environ=os.environ,
                progress=progress,
            )
    text = roll.markdown(report)
    if report_path is not None:
        write_atomic(report_path, text.encode("utf-8"))
    append_step_summary(text)
    if json_out:
        print_json(report.to_dict())
    else:
        _print(report, roll.title(report), roll.summary(report))
    _exit(report)
    if write and report.rollable is not None and report.branch is None:
        raise WorktreeError(next(n for n in report.notes if n.startswith("not written")))
    if report.unchecked:
        raise SourceError(
            "; ".join(u.describe() for u in report.unchecked),
            hint="check the network and the recipe's upstream.sources, then roll again: "
            "newer upstream may be there",
        )


def _print(report: RollReport, title: str, lines: list[str]) -> None:
    say(styled("bold", title))
    for line in lines:
        say(line)
    for note in report.notes:
        say(styled("dim", note))
    if report.branch:
        say(styled("green", "written"), f" branch {report.branch} ({(report.commit or '')[:12]})")


def _exit(report: RollReport) -> None:
    from kzbuild.model.roll import Outcome

    blocking = report.blocking
    if blocking is None:
        return
    where = f"{blocking.candidate.label} ({blocking.candidate.commit[:12]})"
    if blocking.outcome is Outcome.CONFLICT:
        names = ", ".join(p.name for p in blocking.plan.check.conflicts)
        unknown = [b.patch for b in blocking.plan.bisects if b.culprit is None]
        hint = "the report names the upstream commit that broke each"
        if unknown:
            hint = (
                f"no breaking commit was found for {', '.join(unknown)}; the report says why "
                "(history missing: the bisect needs a git source with history)"
            )
        raise PatchError(f"no candidate is rollable: at {where} {names} conflict(s)", hint=hint)
    if blocking.outcome is Outcome.TESTS_FAILED:
        raise PatchError(f"no candidate is rollable: at {where} a live patch's Kz-Test fails")
    if blocking.outcome is Outcome.WRONG:
        raise WrongOutput(
            f"no candidate is rollable: at {where} the output is past the plan's quality limits",
            hint="the bench step's detail gives the figures",
        )
    if blocking.outcome is Outcome.OVER_BUDGET:
        raise OverMemoryBudget(
            f"no candidate is rollable: at {where} a run is past the plan's memory limits",
            hint="the bench step's detail names them",
        )
    if blocking.outcome is Outcome.REGRESSED:
        raise RegressionFound(
            f"no candidate is rollable: at {where} the bench regressed past the threshold"
        )
    raise BuildFailed(f"no candidate is rollable: at {where} {blocking.outcome.value}")
