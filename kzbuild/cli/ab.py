"""``kzbuild ab``: what each patch buys: the full stack against the stack without each live patch,
and bare upstream."""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Optional

import typer

from kzbuild.cli.bench import last_line_to
from kzbuild.cli.benchoptions import (
    BatchOpt,
    CooldownOpt,
    DevOpt,
    GenOpt,
    ModelOpt,
    NglOpt,
    PlanOpt,
    PromptOpt,
    RepetitionsOpt,
    SweepOpt,
    ThreadsOpt,
    UbatchOpt,
    bench_args,
)
from kzbuild.cli.connect import open_pool
from kzbuild.cli.memoryview import check_budget, plan_turn, print_turn, turn_json
from kzbuild.cli.options import (
    DeviceOpt,
    EnvOpt,
    JsonOpt,
    MarkdownOpt,
    RecipeArg,
    TimeoutOpt,
    TrustOpt,
    WaitOpt,
    load_recipe,
)
from kzbuild.cli.ui import (
    Cell,
    Column,
    Styled,
    activity,
    context,
    not_empty,
    print_json,
    say,
    say_rich_table,
    styled,
    write_out,
)
from kzbuild.errors import RegressionFound, WrongOutput
from kzbuild.measure import ab, plans, quality
from kzbuild.measure.request import resolve_ab
from kzbuild.model.ab import DEFAULT_BLOCKS, AbResult, VariantSpec
from kzbuild.model.build import BuildEvent, BuildOptions
from kzbuild.model.interleave import DEFAULT_COOL_WAIT, Turn
from kzbuild.model.plan import Plan
from kzbuild.model.request import AbArgs
from kzbuild.model.turn import TurnTime


def register(app: typer.Typer) -> None:
    app.command("ab")(ab_command)


def ab_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    extra: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="More llama-bench arguments after -- (give RECIPE first), passed as given."
        ),
    ] = None,
    device: DeviceOpt = None,
    model: ModelOpt = None,
    prompt: PromptOpt = None,
    gen: GenOpt = None,
    ngl: NglOpt = None,
    threads: ThreadsOpt = None,
    batch: BatchOpt = None,
    ubatch: UbatchOpt = None,
    dev: DevOpt = None,
    repetitions: RepetitionsOpt = None,
    env: EnvOpt = None,
    sweep: SweepOpt = None,
    cooldown: CooldownOpt = 0.0,
    timeout: TimeoutOpt = None,
    plan_file: PlanOpt = None,
    target: Annotated[
        Optional[str],
        typer.Option(
            "--target", callback=not_empty, help="Build target (default: the recipe's first)."
        ),
    ] = None,
    variant: Annotated[
        Optional[list[str]],
        typer.Option(
            "--variant",
            help="Only these variants besides the full stack: upstream, minus:PATCH, or minus for "
            "all (repeatable; default: every one).",
        ),
    ] = None,
    blocks: Annotated[
        Optional[int],
        typer.Option(
            "--blocks",
            min=1,
            max=1000,
            help="Interleaved blocks; each runs every variant once (default: the plan's, else "
            f"{DEFAULT_BLOCKS}).",
        ),
    ] = None,
    seed: Annotated[
        Optional[int],
        typer.Option(
            "--seed",
            min=0,
            help="Seed of the interleaved order and the sweep order (default: the plan's, else "
            "fresh; recorded).",
        ),
    ] = None,
    cool_to: Annotated[
        Optional[str],
        typer.Option(
            "--cool-to",
            callback=not_empty,
            help="Before each block wait until the device's thermal zones read below this, e.g. "
            "45C.",
        ),
    ] = None,
    cool_wait: Annotated[
        Optional[float],
        typer.Option(
            "--cool-wait",
            help=f"Longest wait for --cool-to, seconds (default {DEFAULT_COOL_WAIT:g}); then the "
            "block starts, marked not cooled.",
        ),
    ] = None,
    cool_zones: Annotated[
        Optional[list[str]],
        typer.Option(
            "--cool-zones",
            help="Thermal zone types (fnmatch patterns, e.g. 'cpu*') that --cool-to watches "
            "(repeatable; default all).",
        ),
    ] = None,
    wait: WaitOpt = 0.0,
    trust_new_host: TrustOpt = False,
    plot: Annotated[
        Optional[Path],
        typer.Option("--plot", help="Write a PNG of each patch's effect with its interval."),
    ] = None,
    max_kld: Annotated[
        Optional[float],
        typer.Option(
            "--max-kld",
            min=0,
            help="Check each variant's output: the mean KL divergence it may reach against the "
            "reference (overrides the plan's quality.max_kld).",
        ),
    ] = None,
    min_top1: Annotated[
        Optional[float],
        typer.Option(
            "--min-top1",
            min=0,
            max=100,
            help="Check each variant's output: the percent of tokens whose top-1 must agree with "
            "the reference (overrides the plan's).",
        ),
    ] = None,
    markdown: MarkdownOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Measure what each patch buys: the full stack against the stack without each live patch, and
    bare upstream.

    Each variant is synced into WORK/ab/RECIPE/VARIANT, built (content-addressed, ccache) and
    deployed; then all are benched in interleaved blocks in a seeded random order. For each patch,
    test and configuration: the full stack's median against the variant's with a 95% bootstrap
    interval. Exits 9 when a patch's Kz-Expect trailer is contradicted; 17 when a variant's output
    is past the quality limits (plan quality:, --max-kld, --min-top1): it is wrong, whatever its
    speed.

    With --device POOL, the plan's runs are spread over the pool's free devices: each run is one
    comparison, every variant interleaved on one device for all its blocks; effects are per device.
    """
    settings = context(ctx).settings
    loaded_recipe = load_recipe(settings, recipe)
    request = resolve_ab(
        bench_args(ctx),  # the llama-bench options above, as given
        AbArgs(
            target=target,
            variants=tuple(variant or ()),
            blocks=blocks,
            cool_to=cool_to,
            cool_wait=cool_wait,
            cool_zones=tuple(cool_zones or ()),
            max_kld=max_kld,
            min_top1=min_top1,
        ),
        default_target=loaded_recipe.build.targets[0],
    )
    plan, precision = request.bench.plan, request.precision
    with ExitStack() as opened:
        members = open_pool(
            settings, request.bench.device, loaded_recipe.device, trust_new_host, opened
        )
        for found, transport in members:
            if plan is not None:
                plans.check_model(plan, transport, found)
        where = ", ".join(found.name for found, _ in members)
        with activity(f"ab of {loaded_recipe.name} on {where}") as progress:

            def on_build(spec: VariantSpec, event: BuildEvent) -> None:
                progress(f"building {spec.name}: {event.stage} {event.line}".strip())

            def on_turn(name: str, turn: Turn) -> None:
                progress(
                    f"{name + ': ' if name else ''}block {turn.block + 1}/{turn.blocks}, "
                    f"{turn.variant}"
                )

            def on_quality(variant: str) -> None:
                progress(f"quality: {variant}")

            result = ab.run_ab(
                settings,
                loaded_recipe,
                members,
                request.bench.runs,
                target=request.target,
                environ=os.environ,
                blocks=request.blocks,
                selection=request.selection,
                seed=request.seed,
                cooling=request.cooling,
                options=BuildOptions(),
                wait=wait,
                on_build=on_build,
                on_turn=on_turn,
                on_stderr=last_line_to(progress),
                min_effect_pct=precision.min_effect_pct,
                max_width_pct=precision.max_width_pct,
                max_seconds=precision.max_seconds,
                quality_spec=request.quality,
                on_quality=on_quality,
            )
    if plot is not None:
        ab.plot_effects(result.effects, plot)
    turns = variant_turns(plan, result) if plan is not None else {}
    if json_out:
        shown_turns = {"turns": {k: turn_json(t) for k, t in turns.items()}} if turns else {}
        print_json(result_json(result) | ({"plot": str(plot)} if plot else {}) | shown_turns)
    elif markdown:
        write_out(
            ab.markdown(result.effects, result.variants, result.checks)
            + quality.markdown(result.quality, result.patch_quality)
        )
    else:
        print_report(result)
        for name, turned in turns.items():
            print_turn(name, turned)
        if plot is not None:
            say(f"plot: {plot}")
    if result.wrong:
        raise WrongOutput(
            "; ".join(f"{r.variant} is wrong: {'; '.join(r.problems)}" for r in result.wrong)
        )
    if result.contradicted:
        raise RegressionFound("; ".join(check.describe for check in result.contradicted))
    check_budget([r for run in result.runs for rs in run.run.records.values() for r in rs])


def variant_turns(plan: Plan, result: AbResult) -> dict[str, TurnTime]:
    """Each variant's turn, from its records of the plan's prefill and decode runs (none
    without a turn)."""
    variants = dict.fromkeys(name for run in result.runs for name in run.run.records)
    turns = {}
    for variant in variants:
        by_run = {run.name: run.run.records.get(variant, ()) for run in result.runs}
        turned = plan_turn(plan, by_run)
        if turned is not None:
            turns[variant] = turned
    return turns


def result_json(result: AbResult) -> dict[str, object]:
    data = dataclasses.asdict(result)
    data["runs"] = [
        {
            "name": r.name,
            "device": r.device,
            "run_id": r.run.run_id,
            "seed": r.run.seed,
            "order": r.run.order,
            "logs": str(r.run.logs),
            "starts": [dataclasses.asdict(s) for s in r.run.starts],
            "records": {k: len(v) for k, v in r.run.records.items()},
        }
        for r in result.runs
    ]
    data["checks"] = [
        {
            "expectation": dataclasses.asdict(c.expectation),
            "verdict": c.verdict,
            "effects": [dataclasses.asdict(e) for e in c.effects],
        }
        for c in result.checks
    ]
    return data


def print_report(result: AbResult) -> None:
    built = ", ".join(
        f"{v.spec.name} ({v.build_id}{', reused' if v.reused else ''})"
        for v in result.variants
        if v.build_id
    )
    say(f"{result.recipe} on {result.device}, target {result.target}; variants: {built}")
    for v in result.variants:
        if v.problem:
            say(styled("red", f"{v.spec.name} could not be built:"), f" {v.problem}")
    for r in result.runs:
        say(
            f"run {r.run.run_id}{' (' + r.name + ')' if r.name else ''} on {r.device}: "
            f"{len(r.run.order)} blocks, seed {r.run.seed}, logs in {r.run.logs}"
        )
        for start in r.run.starts:
            state = "cooled" if start.cooled else "NOT cooled"
            say(
                f"  block {start.block + 1}: {state}, hottest {start.hottest_c:.1f} C after "
                f"{start.waited_s:.0f} s"
            )
    output = {q.variant: q for q in result.patch_quality}
    columns = ("patch", "test", "configuration", "full t/s", "without t/s", "effect") + (
        ("mean KLD without -> full", "output") if output else ()
    )
    rows: list[tuple[Cell, ...]] = []
    for e in result.effects:
        text = e.effect.describe()
        shown = (
            styled("green", text)
            if e.effect.low_pct > 0
            else styled("red", text)
            if e.effect.high_pct < 0
            else text
        )
        judged = output.get(e.variant)
        beside: tuple[Cell, ...] = (
            (quality.kld_change(judged), verdict_text(judged.verdict))
            if judged
            else ("", "")
            if output
            else ()
        )
        rows.append(
            (
                e.patch or "whole stack (vs upstream)",
                ab.shown_test(e, result.effects),
                e.config,
                f"{e.full_median:.2f}",
                f"{e.variant_median:.2f}",
                shown,
                *beside,
            )
        )
    say_rich_table(
        [Column(column, right=column.endswith("t/s"), fold=True) for column in columns],
        rows,
        title="what each patch buys: full stack vs the stack without it (median of turns, 95% "
        "bootstrap interval)",
    )
    print_quality(result)
    for check in result.checks:
        colour = {"contradicted": "red", "confirmed": "green"}.get(check.verdict, "yellow")
        say(styled(colour, check.describe))


def verdict_text(verdict: str) -> Styled:
    return styled("green", "right") if verdict == "right" else styled("bold red", "WRONG")


def print_quality(result: AbResult) -> None:
    """Each variant's output against the reference: mean KLD, its 99th percentile, top-1 agreement,
    PPL ratio."""
    if not result.quality:
        return
    first = result.quality[0]
    columns = ("variant", "mean KLD", "99% KLD", "top-1 %", "PPL ratio", "output")
    say_rich_table(
        [Column(column, right=column not in ("variant", "output")) for column in columns],
        [
            (
                record.variant,
                f"{record.stats.kld_mean:.6f}",
                f"{record.stats.kld_p99:.6f}",
                f"{record.stats.top1_pct:.3f}",
                f"{record.stats.ppl_ratio:.4f}",
                (
                    verdict_text(record.verdict),
                    f" ({'; '.join(record.problems)})" if record.problems else "",
                ),
            )
            for record in result.quality
        ],
        title=f"output against {first.reference.variant} "
        f"({' '.join(f'{k}={v}' for k, v in first.reference.options.items())}), "
        f"corpus {first.corpus.name} ({first.corpus.sha256[:12]}), model "
        f"{first.model.sha256 and first.model.sha256[:12]}",
    )
    for judged in result.patch_quality:
        if judged.why:
            say(styled("red", f"{judged.patch or 'the whole stack'}: {judged.why}"))
