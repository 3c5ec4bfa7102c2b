"""Bench several deployed variants on one device in interleaved blocks (kzbuild ab, kzbuild roll).

Each block runs every variant once, in an order drawn from one seeded generator
(:func:`kzbuild.measure.stats.interleaved_order`), so that a device's drift (heat, clocks,
background
load) spreads over all variants instead of landing on whichever ran last. Each turn is one
``kzbuild bench`` run of that variant's release (run straight from ``ROOT/releases/<name>``;
``current`` is never switched), and its records carry the variant, the block and the seed.
With cooling, each block first waits (bounded) until the device's thermal zones read below the
limit, and what they read is recorded.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from kzbuild.adapters.settings import Settings
from kzbuild.build.artifacts import load_artifact
from kzbuild.device.base import ByteSink, Transport
from kzbuild.device.deploy import deploy
from kzbuild.device.devicelock import device_lock
from kzbuild.device.run import check_seconds, env_warnings, memory_measured, release_named
from kzbuild.errors import ConfigError, DeviceError
from kzbuild.measure.bench import bench, check_spec, device_model, new_run_id, probe, spec_env_names
from kzbuild.measure.memory import check_recipe_formats
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.stats import fresh_seed, interleaved_order
from kzbuild.model.bench import BenchPart, BenchSpec
from kzbuild.model.device import Device
from kzbuild.model.interleave import Arm, BlockStart, Checked, Cooling, InterleavedRun, Turn
from kzbuild.model.result import BenchRecord, VariantInfo

log = logging.getLogger(__name__)

TEMPERATURE_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:°?C)?\s*$", re.IGNORECASE | re.ASCII)
MAX_BLOCKS = 1000


def deploy_arms(
    transport: Transport, device: Device, artifacts: Iterable[tuple[str, Path]], *, wait: float
) -> list[Arm]:
    """Each named artifact deployed as a release of its own (only contents the device lacks
    move), as the arms of an interleaved run; the last one deployed is left ``current``."""
    return [
        Arm(name, deploy(transport, device, load_artifact(path), wait=wait).release)
        for name, path in artifacts
    ]


def parse_temperature(text: str) -> float:
    """``45C``, ``45``, ``42.5C`` -> degrees Celsius."""
    match = TEMPERATURE_RE.match(text)
    if match is None:
        raise ConfigError(
            f"--cool-to '{text}' is not a temperature", hint="degrees Celsius, e.g. 45C"
        )
    value = float(match[1])
    if not -40 <= value <= 150:
        raise ConfigError(
            f"--cool-to '{text}' is not a device temperature",
            hint="degrees Celsius between -40 and 150, e.g. 45C",
        )
    return value


def check_cooling(cooling: Cooling) -> None:
    check_seconds("--cool-wait", cooling.max_wait_s, zero_ok=True)
    check_seconds("cooling poll", cooling.poll_s)
    if not cooling.zones or not all(pattern.strip() for pattern in cooling.zones):
        raise ConfigError("--cool-zones: give one or more zone type patterns, e.g. 'cpu*'")


def thermal_zones(transport: Transport, device: Device, cooling: Cooling) -> dict[str, float]:
    """The temperatures (deg C) of the zones ``cooling`` watches, read through the transport;
    a device without readable zones, or none that match, is an error (kzbuild ab checks before
    building)."""
    zones = probe(transport, cooling.sysfs).conditions.get("thermal_c", {})
    if not zones:
        raise DeviceError(
            f"{device.name}: no thermal zones to read "
            f"({cooling.sysfs}/class/thermal/thermal_zone*/temp: none readable), so --cool-to "
            "cannot tell when it is cool",
            hint="drop --cool-to (or use --cooldown SECONDS between runs) on a device without "
            "thermal zones",
        )
    chosen = {
        name: value
        for name, value in zones.items()
        if any(fnmatch.fnmatchcase(name, p) for p in cooling.zones)
    }
    if not chosen:
        raise ConfigError(
            f"{device.name}: no thermal zone matches --cool-zones {' '.join(cooling.zones)}",
            hint=f"its zones: {', '.join(sorted(zones))}",
        )
    return chosen


def wait_cool(
    transport: Transport,
    device: Device,
    cooling: Cooling,
    block: int,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> BlockStart:
    """Read the device's thermal zones until the hottest chosen one is below the limit, or the
    wait runs out (then the block starts anyway, marked as not cooled, with a warning)."""
    started = clock()
    while True:
        chosen = thermal_zones(transport, device, cooling)
        hottest = max(chosen.values())
        waited = round(clock() - started, 1)
        if hottest < cooling.limit_c or waited >= cooling.max_wait_s:
            if hottest >= cooling.limit_c:
                hot = max(chosen, key=lambda name: chosen[name])
                log.warning(
                    "%s: block %d starts at %.1f C (%s), not below %.1f C after %.0f s",
                    device.name,
                    block + 1,
                    hottest,
                    hot,
                    cooling.limit_c,
                    waited,
                )
            return BlockStart(
                block=block,
                temperatures=chosen,
                hottest_c=hottest,
                waited_s=waited,
                cooled=hottest < cooling.limit_c,
            )
        sleep(min(cooling.poll_s, cooling.max_wait_s - waited))


def run_interleaved(
    settings: Settings,
    transport: Transport,
    device: Device,
    arms: Sequence[Arm],
    spec: BenchSpec,
    store: ResultsStore,
    *,
    blocks: int,
    seed: int | None = None,
    order: Sequence[Sequence[str]] | None = None,
    cooling: Cooling | None = None,
    on_turn: Callable[[Turn], None] | None = None,
    on_stderr: ByteSink | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    checked: Checked | None = None,
    stopped: Callable[[], bool] | None = None,
) -> InterleavedRun:
    """Bench every arm ``blocks`` times in interleaved, seeded random blocks; store every record as
    soon as its turn ends (with its variant); return the records per arm.

    The arms' releases must be deployed (kzbuild.device.deploy.deploy returns each one's name).
    ``seed``
    (default: fresh, returned) draws the order of each block; the sweep order inside each turn
    is ``spec.seed`` or, when unset, the same seed. ``spec.cooldown`` also separates turns.
    ``order`` (blocks of arm names, each arm once per block) is taken as given instead of drawn:
    a caller that reports the order it chose (``kzbuild roll``) passes it with its seed.

    Holds the device lock (as ``bench``) from naming the releases to the last turn, so no deploy
    can prune or switch them meanwhile; Busy when another kzbuild holds it. The env warnings,
    the recipes' log format checks and each release's kz-peakrss check happen once per run, or
    once for all the runs that share ``checked``.

    ``stopped()`` is asked before each block after the first: true ends the run there, with the
    blocks done (whole blocks, so every arm has as many turns as every other), which the returned
    order then lists. A search stops a comparison it no longer needs this way."""
    names = [arm.name for arm in arms]
    if len(names) < 2 or len(set(names)) != len(names):
        raise ConfigError(
            "an interleaved experiment needs two or more variants with distinct names (got "
            f"{', '.join(names) or 'none'})"
        )
    if not 1 <= blocks <= MAX_BLOCKS:
        raise ConfigError(f"--blocks {blocks}: give 1 to {MAX_BLOCKS} blocks")
    check_spec(spec)
    if cooling is not None:
        check_cooling(cooling)
    # Held from naming the arms' releases to the last turn: a deploy meanwhile could prune one.
    with device_lock(transport, device.root, "bench") as lock:
        releases = {arm.name: release_named(transport, device, arm.release) for arm in arms}
        checked = checked if checked is not None else Checked()
        for warning in dict.fromkeys(
            w
            for release in releases.values()
            for w in env_warnings(settings, release, spec_env_names(spec))
        ):
            if warning not in checked.warned:
                log.warning("%s", warning)
                checked.warned.add(warning)
        for recipe in dict.fromkeys(r.manifest.get("recipe") for r in releases.values()):
            name = recipe if isinstance(recipe, str) else None
            if name not in checked.recipes:
                check_recipe_formats(settings, name)
                checked.recipes.add(name)
        for release in releases.values():
            if release.dir not in checked.measured:
                checked.measured[release.dir] = memory_measured(
                    transport, device, release, spec.memory_limits
                )
        model = device_model(transport, device, spec.model)
        seed = fresh_seed(seed)
        if order is None:
            order = interleaved_order(names, blocks, seed)
        elif len(order) != blocks or any(sorted(block) != sorted(names) for block in order):
            raise ConfigError(
                f"an interleaved order must hold each of {', '.join(names)} once in each of "
                f"{blocks} blocks"
            )
        turn_spec = replace(spec, seed=spec.seed if spec.seed is not None else seed)
        run_id = new_run_id(datetime.now(timezone.utc))
        logs = settings.work / "bench" / run_id
        records: dict[str, list[BenchRecord]] = {name: [] for name in names}
        starts: list[BlockStart] = []
        seq = 0

        def sleep_held(seconds: float) -> None:  # a cool-down wait may outlast the lock's lease
            sleep(seconds)
            lock.refresh()

        for block, variants in enumerate(order):
            if block and stopped is not None and stopped():
                order = order[:block]
                break
            start = (
                wait_cool(transport, device, cooling, block, sleep=sleep_held, clock=clock)
                if cooling
                else None
            )
            if start:
                starts.append(start)
            for position, name in enumerate(variants):
                if spec.cooldown and (block or position) and not (start and position == 0):
                    sleep(spec.cooldown)
                if on_turn:
                    on_turn(Turn(block=block, blocks=blocks, position=position, variant=name))
                variant = VariantInfo(
                    name=name,
                    block=block,
                    blocks=blocks,
                    seed=seed,
                    start_c=start.hottest_c if start else None,
                    waited_s=start.waited_s if start else None,
                )
                part = BenchPart(
                    run_id=run_id,
                    logs=logs / f"{block:03d}-{name.replace('/', '--')}",
                    first_seq=seq,
                    model=model,
                    variant=variant,
                    measured=checked.measured[releases[name].dir],
                )
                lock.refresh()
                turn = bench(
                    settings,
                    transport,
                    device,
                    turn_spec,
                    store,
                    on_stderr=on_stderr,
                    sleep=sleep,
                    release=releases[name],
                    part=part,
                )
                records[name] += turn.records
                seq += len(turn.records)
    return InterleavedRun(
        run_id=run_id,
        seed=seed,
        order=tuple(tuple(block) for block in order),
        records={name: tuple(items) for name, items in records.items()},
        starts=tuple(starts),
        logs=logs,
    )
