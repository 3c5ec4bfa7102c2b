"""``kzbuild ab``: what each patch of the stack buys, in tokens per second.

Variants of a recipe: the full stack, the stack without each live patch (one at a time; a patch
the pin already holds is skipped by sync, so leaving it out changes nothing), and bare upstream
at the pin. Each is a real sync of its own series (a derived recipe with the recipe's name whose
series is a subset, synced in turn into one scratch worktree ``WORK/ab/<recipe>/src`` and built
in one build dir, so a variant recompiles only what its patches change), a content-addressed
build (shared artifacts: the full stack is the same build as ``kzbuild build RECIPE``), and a
deploy (only contents the device lacks move). A later patch that does not apply without the one left
out makes that
variant unbuildable: reported, never skipped in silence.

The variants are benched in interleaved blocks (:mod:`kzbuild.measure.interleave`), and for each
patch,
test and configuration the report gives the full stack's median against the variant's with a
95% bootstrap interval (:func:`kzbuild.measure.stats.median_effect`, over each turn's median: the
repetitions of one llama-bench run are not independent). Patches may declare the effect they
are for (``Kz-Expect: pp512 +10% on pad3``); one whose interval lies wholly on the other side
of zero is contradicted. "No detectable effect" is said only of an interval within +-the plan's
``ab.min_effect_pct``; a wider one that spans 0 is "too wide to decide". With ``ab.max_width_pct``
the blocks are run again, a batch at a time, while any interval is wider than that, until
``ab.max_seconds`` of benching (or MAX_BLOCKS blocks) is reached.

On a pool, each spec (a plan run) is one comparison: :mod:`kzbuild.measure.pool` spreads the specs
over the free devices, every variant of a spec interleaved on one device for all its batches.
"""

from __future__ import annotations

import logging
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from kzbuild.adapters.filelock import locked
from kzbuild.adapters.settings import Settings
from kzbuild.build import builder
from kzbuild.build.toolchains import configured_paths_file
from kzbuild.device.base import ByteSink, Transport
from kzbuild.device.deploy import deploy
from kzbuild.device.store import ProgressCallback
from kzbuild.errors import ConfigError, PatchError
from kzbuild.measure import quality
from kzbuild.measure.bench import check_spec
from kzbuild.measure.compare import describe_config, describe_env, varying_env
from kzbuild.measure.interleave import MAX_BLOCKS, check_cooling, run_interleaved, thermal_zones
from kzbuild.measure.pool import deal, spread
from kzbuild.measure.resultplot import save_png
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.stats import SEEDS, fresh_seed, median_effect
from kzbuild.model.ab import (
    ALL_MINUS,
    FULL,
    MINUS,
    UPSTREAM,
    AbResult,
    AbRun,
    ExpectCheck,
    PatchEffect,
    VariantBuild,
    VariantSpec,
)
from kzbuild.model.artifact import Artifact
from kzbuild.model.bench import BenchSpec
from kzbuild.model.build import BuildEvent, BuildOptions
from kzbuild.model.device import Device
from kzbuild.model.effect import MIN_EFFECT_PCT, EffectVerdict
from kzbuild.model.interleave import Arm, Cooling, Turn
from kzbuild.model.patch import Expectation, Patch
from kzbuild.model.quality import QualitySpec
from kzbuild.model.recipe import Recipe
from kzbuild.model.result import BenchRecord
from kzbuild.source.stack.check import load_patches
from kzbuild.source.stack.patchfile import expectations
from kzbuild.source.stack.series import read_series

log = logging.getLogger(__name__)

AB_DIR = "ab"  # WORK/ab/<recipe>/<variant>/


# --- the variants ---
def variant_specs(
    series: Sequence[str], live: Sequence[str], selection: Sequence[str] = ()
) -> list[VariantSpec]:
    """The full stack, the stack without each live patch, and bare upstream; or the ``selection`` of
    them (names as reported, ``minus`` for every ``minus:`` variant). The full stack is always in:
    every effect is measured against it."""
    full = VariantSpec(FULL, tuple(series))
    minus = [
        VariantSpec(MINUS + patch, tuple(name for name in series if name != patch), without=patch)
        for patch in live
    ]
    every = [full, *minus, VariantSpec(UPSTREAM, ())]
    if not selection:
        return every
    known = {spec.name for spec in every}
    for name in selection:
        if name not in known and name != ALL_MINUS:
            raise ConfigError(
                f"there is no variant '{name}'",
                hint=f"variants: {', '.join(sorted(known))}, or '{ALL_MINUS}' for every stack "
                "without one live patch",
            )
    wanted = set(selection)
    return [
        spec
        for spec in every
        if spec.name == FULL
        or spec.name in wanted
        or (spec.without is not None and ALL_MINUS in wanted)
    ]


def check_selection(selection: Sequence[str]) -> None:
    """Variant names of a selection: full, upstream, minus, or minus:PATCH (whether PATCH is live
    shows once the full stack is synced)."""
    for name in selection:
        if name not in (FULL, UPSTREAM, ALL_MINUS) and not (
            name.startswith(MINUS) and len(name) > len(MINUS)
        ):
            raise ConfigError(
                f"there is no variant '{name}'",
                hint=f"variants: {FULL}, {UPSTREAM}, {MINUS}PATCH, or '{ALL_MINUS}' for every "
                "stack without one live patch",
            )


def ab_work(settings: Settings, recipe: Recipe) -> Path:
    """WORK/ab/<recipe>: the one scratch worktree (src/) and build dir (build/) every variant of the
    recipe is synced into and built in, in turn; and each variant's derived recipe (<variant>/)."""
    return settings.work / AB_DIR / recipe.name.replace("/", "--")


def derive(settings: Settings, recipe: Recipe, spec: VariantSpec) -> tuple[Settings, Recipe]:
    """The variant as a recipe of its own: the recipe (same name) with a series of the variant's
    patches, copied byte for byte so their digests are the recipe's, and its own lock. All variants
    share one scratch worktree and build dir: a variant after another recompiles only the files
    their patches change (the same paths also keep ccache's hits)."""
    work = ab_work(settings, recipe)
    folder = work / spec.slug
    patches = folder / "patches"
    if patches.exists():
        shutil.rmtree(patches)
    patches.mkdir(parents=True)
    entries = {entry.name: entry.path for entry in read_series(recipe.series).entries}
    for name in spec.patches:
        target = patches / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entries[name], target)
    series = patches / "series"
    series.write_text(
        f"# kzbuild ab: {recipe.name}, variant {spec.name}\n"
        + "".join(f"{name}\n" for name in spec.patches),
        encoding="utf-8",
    )
    toolchains = configured_paths_file(settings)
    if (
        toolchains.is_file()
    ):  # the toolchain paths configured for this project hold for its variants too
        shutil.copyfile(toolchains, configured_paths_file(replace(settings, work=work)))
    return replace(settings, work=work), replace(
        recipe, path=folder / recipe.path.name, series=series
    )


def build_variant(
    settings: Settings,
    recipe: Recipe,
    spec: VariantSpec,
    target: str,
    *,
    environ: Mapping[str, str],
    options: BuildOptions = BuildOptions(),
    progress: Callable[[BuildEvent], None] | None = None,
) -> tuple[VariantBuild, Artifact | None, tuple[str, ...]]:
    """Sync and build one variant; returns it, its artifact, and the patches its sync applied
    (not skipped as upstreamed). A patch that does not apply makes the variant's problem."""
    variant_settings, derived = derive(settings, recipe, spec)
    shared = replace(
        options, artifacts=options.artifacts or builder.artifacts_root(settings)
    )  # one content-addressed store
    try:
        prepared = builder.prepare(
            variant_settings, derived, target, environ=environ, options=shared, progress=progress
        )
    except PatchError as exc:
        left_out = f" without {spec.without}" if spec.without else ""
        return (
            VariantBuild(
                spec,
                None,
                False,
                problem=f"{exc.message}{' (the stack' + left_out + ')' if left_out else ''}",
            ),
            None,
            (),
        )
    result = builder.build(prepared, progress=progress)
    applied = tuple(p.file for p in prepared.lock.patches if p.commit)
    return VariantBuild(spec, result.artifact.build_id, result.reused), result.artifact, applied


def build_variants(
    settings: Settings,
    recipe: Recipe,
    target: str,
    *,
    environ: Mapping[str, str],
    selection: Sequence[str] = (),
    options: BuildOptions = BuildOptions(),
    progress: Callable[[VariantSpec, BuildEvent], None] | None = None,
) -> list[tuple[VariantBuild, Artifact | None]]:
    """The full stack first (its sync says which patches are live), then the other variants; one
    ab of a recipe at a time (they share the scratch worktree)."""
    series = [entry.name for entry in read_series(recipe.series).entries]

    def report(spec: VariantSpec) -> Callable[[BuildEvent], None] | None:
        return (lambda event: progress(spec, event)) if progress else None

    with locked(
        ab_work(settings, recipe) / ".lock", what=f"the ab worktree of {recipe.name}", wait=0
    ):
        full_spec = VariantSpec(FULL, tuple(series))
        full, artifact, live = build_variant(
            settings,
            recipe,
            full_spec,
            target,
            environ=environ,
            options=options,
            progress=report(full_spec),
        )
        if full.problem:
            raise PatchError(
                f"the full stack of {recipe.name} does not apply: {full.problem}",
                hint=f"kzbuild sync {recipe.name} shows it in the recipe's worktree",
            )
        built = [(full, artifact)]
        for spec in variant_specs(series, live, selection)[1:]:
            variant, artifact, _ = build_variant(
                settings,
                recipe,
                spec,
                target,
                environ=environ,
                options=options,
                progress=report(spec),
            )
            if variant.problem:
                log.warning("variant %s cannot be built: %s", spec.name, variant.problem)
            built.append((variant, artifact))
    return built


def deploy_variants(
    transport: Transport,
    device: Device,
    built: Sequence[tuple[VariantBuild, Artifact | None]],
    *,
    wait: float = 0.0,
    on_progress: ProgressCallback | None = None,
) -> list[VariantBuild]:
    """Deploy every buildable variant (a release each; only contents the device lacks move). The
    full stack goes last, so ``current`` is left on it."""
    deployed: dict[str, VariantBuild] = {}
    for variant, artifact in sorted(built, key=lambda item: item[0].spec.name == FULL):
        if artifact is None:
            deployed[variant.spec.name] = variant
            continue
        result = deploy(transport, device, artifact, on_progress=on_progress, wait=wait)
        deployed[variant.spec.name] = replace(
            variant, release=result.release, bytes_sent=result.bytes_sent
        )
    return [deployed[variant.spec.name] for variant, _ in built]


def stack_expectations(patches: Sequence[Patch]) -> list[Expectation]:
    """Every Kz-Expect of the series' patches."""
    return [found for patch in patches for found in expectations(patch)]


# --- the report ---
def effects(
    records: Mapping[str, Sequence[BenchRecord]],
    variants: Sequence[VariantSpec],
    *,
    seed: int = 0,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> list[PatchEffect]:
    """For each variant besides the full stack, each test and configuration both measured: the full
    stack's median against the variant's (what the patch, or for upstream the whole stack, buys).
    Each turn's record counts once, by its median."""
    full = _turns(records.get(FULL, ()))
    shown_env = varying_env([r for rs in records.values() for r in rs])
    found = []
    for spec in variants:
        if spec.name == FULL:
            continue
        for key, turns in _turns(records.get(spec.name, ())).items():
            if key not in full:
                continue
            first = full[key][0]
            effect = median_effect(
                _medians(turns), _medians(full[key]), seed=seed, min_effect_pct=min_effect_pct
            )
            config = " ".join(
                part
                for part in (
                    describe_config(first),
                    describe_env((k, v) for k, v in first.env_set if k in shown_env),
                )
                if part
            )
            found.append(
                PatchEffect(
                    variant=spec.name,
                    patch=spec.without,
                    test=first.test,
                    config=config,
                    full_median=statistics.median(_medians(full[key])),
                    variant_median=statistics.median(_medians(turns)),
                    effect=effect,
                    device=first.device.name,
                )
            )
    return found


def _turns(records: Sequence[BenchRecord]) -> dict[tuple[object, ...], list[BenchRecord]]:
    grouped: dict[tuple[object, ...], list[BenchRecord]] = defaultdict(list)
    for record in records:
        if record.summary.median:
            grouped[record.group_key].append(record)
    return grouped


def _medians(records: Sequence[BenchRecord]) -> list[float]:
    return [float(r.summary.median) for r in records if r.summary.median]


def check_expectations(
    declared: Sequence[Expectation], measured: Sequence[PatchEffect], devices: Sequence[str]
) -> list[ExpectCheck]:
    """Each declared effect against the measured ones of its patch, metric and device: contradicted
    when any configuration's interval lies wholly on the other side of zero."""
    checks = []
    for expectation in declared:
        if expectation.device not in devices:
            checks.append(ExpectCheck(expectation, "other device", ()))
            continue
        matching = tuple(
            e
            for e in measured
            if e.patch == expectation.patch
            and e.test == expectation.metric
            and e.device == expectation.device
        )
        if not matching:
            checks.append(ExpectCheck(expectation, "not measured", ()))
        elif any(e.effect.contradicts(expectation.pct) for e in matching):
            checks.append(
                ExpectCheck(
                    expectation,
                    "contradicted",
                    tuple(e for e in matching if e.effect.contradicts(expectation.pct)),
                )
            )
        elif any(
            e.effect.detectable and (e.effect.delta_pct > 0) == (expectation.pct > 0)
            for e in matching
        ):
            checks.append(ExpectCheck(expectation, "confirmed", matching))
        elif all(e.effect.verdict is EffectVerdict.NONE for e in matching):
            checks.append(ExpectCheck(expectation, "no detectable effect", matching))
        else:
            checks.append(ExpectCheck(expectation, "undecided (interval too wide)", matching))
    return checks


def markdown(
    found: Sequence[PatchEffect], variants: Sequence[VariantBuild], checks: Sequence[ExpectCheck]
) -> str:
    """The report as a markdown table (plus unbuildable variants and the declared effects)."""
    lines = [
        "| patch | test | configuration | full stack t/s | without it t/s | what it buys (full vs "
        "without, 95% interval) |",
        "|---|---|---|---:|---:|---|",
    ]
    for e in found:
        patch = e.patch or "whole stack (vs upstream)"
        lines.append(
            f"| {patch} | {shown_test(e, found)} | {e.config} | {e.full_median:.2f} | "
            f"{e.variant_median:.2f} | {e.effect.describe()} |"
        )
    for variant in variants:
        if variant.problem:
            lines.append(f"\n**{variant.spec.name} could not be built:** {variant.problem}")
    if checks:
        lines += ["", "| patch | Kz-Expect | verdict |", "|---|---|---|"]
        lines += [
            f"| {c.expectation.patch} | {c.expectation.describe()} | {c.verdict} |" for c in checks
        ]
    return "\n".join(lines) + "\n"


def shown_test(effect: PatchEffect, found: Sequence[PatchEffect]) -> str:
    """The effect's test, with its device when the effects come from a pool's devices."""
    several = len({e.device for e in found}) > 1
    return f"{effect.test} on {effect.device}" if several else effect.test


def plot_effects(found: Sequence[PatchEffect], out: Path) -> Path:
    """A PNG: each patch's effect per test and configuration, as a bar with its 95% interval."""
    if not found:
        raise ConfigError("nothing to plot: no effect was measured")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{e.patch or 'whole stack'} | {shown_test(e, found)} {e.config}" for e in found]
    height = max(3.0, 0.35 * len(found) + 1.5)
    figure, axes = plt.subplots(figsize=(11, height))
    ys = list(range(len(found)))
    deltas = [e.effect.delta_pct for e in found]
    errors = [
        [e.effect.delta_pct - e.effect.low_pct for e in found],
        [e.effect.high_pct - e.effect.delta_pct for e in found],
    ]
    colors = [
        "tab:green" if e.effect.low_pct > 0 else "tab:red" if e.effect.high_pct < 0 else "tab:gray"
        for e in found
    ]
    axes.barh(ys, deltas, xerr=errors, color=colors, capsize=3)
    axes.axvline(0, color="black", linewidth=0.8)
    axes.set_yticks(ys, labels, fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel(
        "what the patch buys: full stack vs the stack without it, % (median, 95% bootstrap "
        "interval; gray: no detectable effect)"
    )
    axes.grid(True, axis="x", alpha=0.3)
    return save_png(figure, out, option="--plot")


# --- the whole experiment ---
def more_blocks(
    measured: Sequence[PatchEffect],
    max_width_pct: float | None,
    max_seconds: float | None,
    spent: float,
) -> bool:
    """Whether another batch of blocks runs: a width is set, an interval is wider, time is left."""
    if max_width_pct is None or not measured:
        return False
    if max_seconds is not None and spent >= max_seconds:
        log.warning(
            "ab: %.0f s spent (max_seconds %g); intervals still wider than %g%% stay undecided",
            spent,
            max_seconds,
            max_width_pct,
        )
        return False
    return any(e.effect.width_pct > max_width_pct for e in measured)


def run_ab(
    settings: Settings,
    recipe: Recipe,
    devices: Sequence[tuple[Device, Transport]],
    specs: Sequence[tuple[str, BenchSpec]],
    *,
    target: str,
    environ: Mapping[str, str],
    blocks: int,
    selection: Sequence[str] = (),
    seed: int | None = None,
    cooling: Cooling | None = None,
    options: BuildOptions = BuildOptions(),
    wait: float = 0.0,
    on_build: Callable[[VariantSpec, BuildEvent], None] | None = None,
    on_deploy: ProgressCallback | None = None,
    on_turn: Callable[[str, Turn], None] | None = None,
    on_stderr: ByteSink | None = None,
    sleep: Callable[[float], None] = time.sleep,
    min_effect_pct: float = MIN_EFFECT_PCT,
    max_width_pct: float | None = None,
    max_seconds: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    quality_spec: QualitySpec | None = None,
    on_quality: Callable[[str], None] | None = None,
) -> AbResult:
    """Build and deploy the variants, bench each spec in interleaved blocks (one experiment per
    spec, all with one seed), and report what each patch buys and which Kz-Expect it contradicts.

    With several ``devices`` (a pool's free members) the specs are spread over them
    (:mod:`kzbuild.measure.pool`): each spec is one experiment, every variant interleaved on one
    device, and keeps that device for all its batches; the effects are per device. The quality
    check runs on the first device."""
    for _, spec in specs:
        check_spec(spec)
    expected = stack_expectations(load_patches(recipe))
    used = [member for member, _ in deal(devices, specs)]
    if cooling is not None:
        check_cooling(cooling)
        for device, transport in used:  # a device without thermal zones fails before any build
            thermal_zones(transport, device, cooling)
    if quality_spec is not None and selection and quality_spec.reference not in selection:
        selection = (*selection, quality_spec.reference)  # the variant whose logits are the base
    built = build_variants(
        settings,
        recipe,
        target,
        environ=environ,
        selection=selection,
        options=options,
        progress=on_build,
    )
    if (
        quality_spec is not None
    ):  # before any run: a tree that prints other statistics is refused, not misread
        quality.check_worktree_formats(
            replace(settings, work=ab_work(settings, recipe)).worktree(recipe.name)
        )
    deployed = {
        device.name: deploy_variants(transport, device, built, wait=wait, on_progress=on_deploy)
        for device, transport in used
    }
    (first, first_transport), variants = used[0], deployed[used[0][0].name]
    if quality_spec is not None:
        quality.check_tools(first_transport, first, variants)
    arms = {
        name: [Arm(v.spec.name, v.release) for v in done if v.release is not None]
        for name, done in deployed.items()
    }
    if len(arms[first.name]) < 2:
        raise ConfigError(
            "nothing to compare: only "
            f"{', '.join(a.name for a in arms[first.name]) or 'no variant'} could be built",
            hint="; ".join(f"{v.spec.name}: {v.problem}" for v in variants if v.problem)
            or "select more variants",
        )
    seed = fresh_seed(seed)
    started = clock()
    runs: list[AbRun] = []
    records: dict[str, list[BenchRecord]] = defaultdict(list)
    measured: list[PatchEffect] = []

    def experiments(
        seed: int, member: tuple[Device, Transport], mine: Sequence[tuple[str, BenchSpec]]
    ) -> list[AbRun]:
        """One device's share of the specs, each an interleaved experiment of every variant."""
        device, transport = member
        done = []
        # a store of its own: the devices of a pool bench at once, each in its thread
        with ResultsStore(settings.results) as store:
            for name, spec in mine:

                def turn(event: Turn, name: str = name) -> None:
                    if on_turn:
                        on_turn(name, event)

                run = run_interleaved(
                    settings,
                    transport,
                    device,
                    arms[device.name],
                    spec,
                    store,
                    blocks=blocks,
                    seed=seed,
                    cooling=cooling,
                    on_turn=turn,
                    on_stderr=on_stderr,
                    sleep=sleep,
                )
                done.append(AbRun(name, device.name, run))
        return done

    for batch in range(MAX_BLOCKS // blocks):
        if batch and not more_blocks(measured, max_width_pct, max_seconds, clock() - started):
            break
        batch_seed = (seed + batch) % SEEDS  # the first batch draws with the recorded seed itself
        for run in spread(used, specs, partial(experiments, batch_seed)):
            runs.append(run)
            for variant, found in run.run.records.items():
                records[variant] += found
        benched = [v.spec for v in variants if v.release is not None]
        measured = effects(records, benched, seed=seed, min_effect_pct=min_effect_pct)
    names = [device.name for device, _ in used]
    checks = check_expectations(expected, measured, names)
    judged = (
        quality.check_ab(
            settings,
            first_transport,
            first,
            variants,
            quality_spec,
            specs[0][1].model,
            on_variant=on_quality,
        )
        if quality_spec
        else ((), ())
    )
    return AbResult(
        recipe=recipe.name,
        device=", ".join(names),
        target=target,
        seed=seed,
        variants=tuple(variants),
        runs=tuple(runs),
        effects=tuple(measured),
        checks=tuple(checks),
        quality=judged[0],
        patch_quality=judged[1],
    )
