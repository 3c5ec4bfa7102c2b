"""``kzbuild bisect``: the upstream commit that moved a number, on a device."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Optional

import typer

from kzbuild.adapters.files import write_atomic
from kzbuild.cli.options import (
    DeviceOpt,
    JsonOpt,
    MarkdownOpt,
    NoRemoteOpt,
    RecipeArg,
    TrustOpt,
    WaitOpt,
    append_step_summary,
    load_recipe,
)
from kzbuild.cli.ui import activity, context, not_empty, print_json, say, write_out
from kzbuild.model.bisect import BisectLimits
from kzbuild.model.request import BisectArgs

LIMITS = BisectLimits()


def register(app: typer.Typer) -> None:
    app.command("bisect")(bisect_command)


def bisect_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    good: Annotated[
        str,
        typer.Option(
            "--good",
            callback=not_empty,
            help="The last commit known good: sha, branch or tag of a git source.",
        ),
    ] = "",
    bad: Annotated[
        str,
        typer.Option(
            "--bad",
            callback=not_empty,
            help="The first commit known bad (a later commit on the same history).",
        ),
    ] = "",
    plan_file: Annotated[
        Path,
        typer.Option(
            "--plan",
            help="The experiment plan (plans/*.yaml): model, device, llama-bench runs, blocks and "
            "seed.",
        ),
    ] = Path(),
    metric: Annotated[
        Optional[str],
        typer.Option(
            "--metric",
            callback=not_empty,
            help="What is bisected: RUN:TEST, a test's t/s (default: the plan's first run and "
            "test); [RUN:]peak-memory, the peak MiB of the run's process; "
            "[RUN:]buffer:TYPE[:KIND], llama.cpp's buffers of one type (buffer:CPU_REPACK:model); "
            "kld[:STEP], the mean KL divergence against the good end's logits (the plan's "
            "quality:), where a change of STEP (default its max_kld, else 0.01) counts.",
        ),
    ] = None,
    device: DeviceOpt = None,
    target: Annotated[
        Optional[str],
        typer.Option(
            "--target", callback=not_empty, help="Build target (default: the recipe's first)."
        ),
    ] = None,
    min_effect: Annotated[
        float,
        typer.Option(
            "--min-effect",
            help="Percent change of the median below which two commits count as the same.",
        ),
    ] = LIMITS.min_effect_pct,
    samples: Annotated[
        int,
        typer.Option(
            "--samples",
            min=1,
            max=1000,
            help="Interleaved blocks per round; a pair not yet told apart gets another round.",
        ),
    ] = LIMITS.samples_per_round,
    max_samples: Annotated[
        int,
        typer.Option(
            "--max-samples",
            min=1,
            max=1000,
            help="Samples a commit may take before the larger move of the median decides.",
        ),
    ] = LIMITS.max_samples,
    seed: Annotated[
        Optional[int],
        typer.Option(
            "--seed",
            min=0,
            help="Seed of the interleaved order (default: the plan's, else 0; part of the record's "
            "identity).",
        ),
    ] = None,
    no_remote_cache: NoRemoteOpt = False,
    wait: WaitOpt = 0.0,
    trust_new_host: TrustOpt = False,
    report_path: Annotated[
        Optional[Path],
        typer.Option(
            "--report",
            help="Write the markdown report here too (and to $GITHUB_STEP_SUMMARY when set).",
        ),
    ] = None,
    markdown: MarkdownOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Find the first upstream commit between --good and --bad that moved a number beyond the noise.

    Each commit tried is built with the patch stack where it applies (bare, and said so, where it
    does not; skipped with the reason where it does not build) through the content-addressed and
    shared caches, then benched interleaved with the two ends of the range on one device. Two
    commits differ when the bootstrap interval of their medians' difference excludes zero and the
    median moved by at least --min-effect; pairs not yet told apart get more samples. The number
    is a test's t/s, the run's peak memory or llama.cpp's buffers (--metric), or the output's mean
    KL divergence against the good end's logits, checked once per commit (--metric kld). The
    record in WORK/bisect/RECIPE/records/ is written after every build and round: run again after
    Ctrl-C or a lost device, the bisect resumes with no commit measured twice.
    """
    from kzbuild.build import remotecache
    from kzbuild.cli.connect import open_pool
    from kzbuild.measure import bisect, plans
    from kzbuild.measure.request import resolve_bisect

    if not plan_file.name:
        raise typer.BadParameter(
            "give the experiment plan that names the model and the llama-bench runs",
            param_hint="'--plan'",
        )
    if not good or not bad:
        raise typer.BadParameter("give both ends of the range", param_hint="'--good' / '--bad'")
    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    request = resolve_bisect(
        BisectArgs(
            plan_file=plan_file,
            metric=metric,
            target=target,
            device=device,
            seed=seed,
            limits=BisectLimits(
                min_effect_pct=min_effect, samples_per_round=samples, max_samples=max_samples
            ),
        ),
        loaded.build.targets[0],
    )
    chosen = request.metric
    remote = remotecache.load_config(settings, os.environ, disabled=no_remote_cache)
    with ExitStack() as opened:
        benchers = {}
        here = []  # devices on this host: a build beside their measurements would slow them
        for found, transport in open_pool(
            settings, request.device, loaded.device, trust_new_host, opened
        ):
            plans.check_model(request.plan, transport, found)
            if found.transport == "local":
                here.append(found.name)
            benchers[found.name] = (
                bisect.QualityBencher(
                    settings, transport, found, request.spec.model, request.quality, wait=wait
                )
                if chosen.anchored
                else bisect.DeviceBencher(
                    settings, transport, found, request.spec, chosen, wait=wait
                )
            )
        where = ", ".join(benchers)
        if here:
            say(f"builds are not made ahead: {', '.join(here)} runs on this host", err=True)
        with activity(f"bisecting {loaded.name} {good}..{bad} on {where}") as progress:
            build = bisect.CommitBuilder(
                settings, loaded, request.target, environ=os.environ, remote=remote
            )
            identity = {
                "recipe": loaded.name,
                "target": request.target,
                "devices": where,
                "metric": chosen.label(),
                "plan": request.plan_digest,
                "limits": repr(request.limits),
            }
            report = bisect.bisect(
                settings,
                loaded,
                good=good,
                bad=bad,
                build=build,
                benchers=benchers,
                identity=identity,
                metric=chosen,
                limits=request.limits,
                seed=request.seed,
                progress=progress,
                build_ahead=not here,
            )
    text = bisect.markdown(report)
    if report_path is not None:
        write_atomic(report_path, text.encode("utf-8"))
    append_step_summary(text)
    if json_out:
        print_json(bisect.to_json(report))
    elif markdown:
        write_out(text)
    else:
        say(bisect.answer(report))
        say(
            f"{bisect.builds_made(report)}, {report.benches} interleaved rounds; every commit "
            "tried: --markdown or --json"
        )
