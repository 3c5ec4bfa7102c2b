"""The resolver of the measuring commands: the command line, the plan and the defaults made into
one frozen request, once, each bad value refused before any device is contacted.

The measuring modules load inside the resolvers that need them: a roll without a plan needs none.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from kzbuild.device.run import parse_env_assignments
from kzbuild.errors import ConfigError
from kzbuild.measure.stats import fresh_seed
from kzbuild.model import roll
from kzbuild.model.ab import DEFAULT_BLOCKS
from kzbuild.model.bench import BenchSpec
from kzbuild.model.interleave import DEFAULT_COOL_WAIT, Cooling
from kzbuild.model.plan import Plan, PlanAb
from kzbuild.model.request import (
    AbArgs,
    AbRequest,
    BenchArgs,
    BenchRequest,
    BisectArgs,
    BisectRequest,
    RollArgs,
    RollRequest,
)


def resolve_bench(args: BenchArgs) -> BenchRequest:
    """``--plan``'s runs, or the one run the options make; the device the option names, else the
    plan's."""
    from kzbuild.measure import plans

    if args.plan_file is None:
        return BenchRequest(None, (("", spec_from_args(args)),), args.device)
    plan = plans.load_plan(args.plan_file)
    refuse_with_plan(args)
    return BenchRequest(
        plan, tuple((run.name, run.spec) for run in plan.runs), args.device or plan.device
    )


def resolve_ab(args: BenchArgs, ab_args: AbArgs, default_target: str) -> AbRequest:
    """An A/B's request: each option over the plan's value over the default. ``--seed`` orders
    the interleaved blocks (and the plan's sweeps), so it may go with a plan."""
    from kzbuild.measure import quality
    from kzbuild.measure.ab import check_selection

    plan_seed = args.seed
    request = resolve_bench(replace(args, seed=None))
    plan = request.plan
    selection = ab_args.variants or (plan.ab.variants if plan else ())
    cooling = _cooling(ab_args, plan)
    check_selection(selection)  # a minus:PATCH that is not live fails after the full sync
    return AbRequest(
        bench=request,
        target=ab_args.target or default_target,
        selection=selection,
        blocks=ab_args.blocks or (plan.ab.blocks if plan and plan.ab.blocks else DEFAULT_BLOCKS),
        seed=plan_seed if plan_seed is not None else plan.seed if plan else None,
        cooling=cooling,
        precision=plan.ab if plan else PlanAb(),
        quality=quality.spec_with_limits(
            plan.quality if plan else None, max_kld=ab_args.max_kld, min_top1=ab_args.min_top1
        ),
    )


def _cooling(ab_args: AbArgs, plan: Plan | None) -> Cooling | None:
    from kzbuild.measure.interleave import parse_temperature

    limit = (
        parse_temperature(ab_args.cool_to)
        if ab_args.cool_to is not None
        else plan.ab.cool_to
        if plan
        else None
    )
    if limit is None:
        return None
    plan_wait = plan.ab.cool_wait if plan else None
    return Cooling(
        limit_c=limit,
        max_wait_s=ab_args.cool_wait
        if ab_args.cool_wait is not None
        else plan_wait
        if plan_wait is not None
        else DEFAULT_COOL_WAIT,
        zones=ab_args.cool_zones or (plan.ab.cool_zones if plan else ()) or ("*",),
    )


def spec_from_args(args: BenchArgs) -> BenchSpec:
    """The bench request the command line makes, checked before any device is contacted."""
    from kzbuild.measure import bench

    if args.model is None:
        raise ConfigError("give the model (-m PATH on the device) or a plan (--plan FILE)")
    spec = BenchSpec(
        model=args.model,
        options=args.llama_bench_options(),
        env=tuple(parse_env_assignments(args.env).items()),
        extra_args=args.extra,
        sweep=tuple(bench.parse_sweep(text) for text in args.sweep),
        seed=args.seed,
        cooldown=args.cooldown,
        timeout=args.timeout,
    )
    bench.check_spec(spec)  # a bad value is a usage error wherever the device is
    return spec


def refuse_with_plan(args: BenchArgs) -> None:
    """A plan declares the whole request: bench options beside it would be silently ignored."""
    given = [f"-{flag}" for flag, _ in args.llama_bench_options()]
    given += [
        flag
        for flag, value in (
            ("-m", args.model),
            ("--env", args.env),
            ("--sweep", args.sweep),
            ("--seed", args.seed),
            ("--timeout", args.timeout),
            ("--", args.extra),
        )
        if value
    ]
    given += ["--cooldown"] if args.cooldown else []
    if given:
        raise ConfigError(
            f"--plan declares the model and the runs; {', '.join(given)} cannot be given with it",
            hint="edit the plan instead",
        )


def resolve_roll(args: RollArgs) -> RollRequest:
    """A roll's request: with a plan, its blocks and seed; the seed drawn here when none is
    given, so the report can name it."""
    plan_target = None if args.plan_target == "none" else args.plan_target
    if args.plan_file is None:
        return RollRequest(None, args.to, plan_target, roll.DEFAULT_BLOCKS, fresh_seed())
    from kzbuild.measure import plans

    plan = plans.load_plan(args.plan_file)
    blocks = plan.ab.blocks or roll.DEFAULT_BLOCKS
    return RollRequest(plan, args.to, plan_target, blocks, fresh_seed(plan.seed))


def resolve_bisect(args: BisectArgs, default_target: str) -> BisectRequest:
    """A bisect's request: the limits checked, the plan loaded, the metric parsed against its runs
    (a kld metric takes one sample per commit: a check of the output gives the same figure
    again); target, device and seed from the options, else the plan, else the defaults."""
    from kzbuild.measure import plans
    from kzbuild.measure.bisect import check_limits
    from kzbuild.model.bisect import Metric
    from kzbuild.model.quality import QualitySpec

    check_limits(args.limits)
    plan = plans.load_plan(args.plan_file)
    quality = plan.quality or QualitySpec()
    metric = Metric.parse(
        args.metric, [run.name for run in plan.runs], max_kld=quality.limits.max_kld
    )
    limits = args.limits
    if metric.anchored:
        limits = replace(limits, samples_per_round=1, max_samples=1)
    return BisectRequest(
        plan=plan,
        plan_digest=hashlib.sha256(args.plan_file.read_bytes()).hexdigest(),
        metric=metric,
        spec=next(run.spec for run in plan.runs if run.name == metric.run),
        quality=quality,
        limits=limits,
        target=args.target or default_target,
        device=args.device or plan.device,
        seed=args.seed if args.seed is not None else plan.seed or 0,
    )
