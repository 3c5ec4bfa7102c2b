"""``kzbuild check RECIPE --device D``: run every ``Kz-Device-Test`` of the recipe's patches on the
device.

A patch names the per-op checks of what it touches (``Kz-Device-Test: test-backend-ops -o
GATED_DELTA_NET -b HTP0``). Each runs through the same runner as ``kzbuild run``: the device's
current release (which must be a build of RECIPE), the device env, nothing added. Each result is
stored in ``results/device-tests.jsonl`` with its provenance (the release's build, the device's
fingerprint, argv, env) and its output kept under ``WORK/device-tests/<run>/``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

from kzbuild.adapters.settings import Settings
from kzbuild.device.base import ByteSink, Transport
from kzbuild.device.run import current_release, memory_measured, run_in_release
from kzbuild.errors import ConfigError
from kzbuild.measure.bench import new_run_id, probe
from kzbuild.measure.resultfiles import JsonlStore
from kzbuild.model.device import Device
from kzbuild.model.devicetest import DeviceTest, DeviceTestResult
from kzbuild.model.memory import MemoryLimits
from kzbuild.model.recipe import Recipe
from kzbuild.model.result import BuildInfo, DeviceInfo
from kzbuild.source.stack.check import load_patches
from kzbuild.source.stack.patchfile import device_tests

DEVICE_TESTS_FILE = "device-tests.jsonl"


def recipe_device_tests(recipe: Recipe) -> list[DeviceTest]:
    """Every well-formed Kz-Device-Test of the recipe's series, in series order."""
    return [test for patch in load_patches(recipe) for test in device_tests(patch)]


def run_device_tests(
    settings: Settings,
    transport: Transport,
    device: Device,
    recipe: Recipe,
    store: JsonlStore[DeviceTestResult],
    *,
    timeout: float | None = None,
    on_test: Callable[[DeviceTest], None] | None = None,
) -> list[DeviceTestResult]:
    """Run the recipe's device checks against the device's current release, storing each result."""
    tests = recipe_device_tests(recipe)
    if not tests:
        raise ConfigError(
            f"no patch of {recipe.name} names a device check",
            hint="add a trailer such as 'Kz-Device-Test: test-backend-ops -o GATED_DELTA_NET -b "
            "HTP0'",
        )
    release = current_release(transport, device)
    built_from = release.manifest.get("recipe")
    if built_from != recipe.name:
        raise ConfigError(
            f"{device.name}: the current release {release.build_id} is a build of "
            f"{built_from or 'an unnamed recipe'}, not {recipe.name}",
            hint=f"deploy it first: kzbuild build {recipe.name} && kzbuild deploy {recipe.name} "
            f"--device {device.name}",
        )
    fingerprint = dict(probe(transport).fingerprint)
    measured = memory_measured(transport, device, release, MemoryLimits())
    run_id = new_run_id(datetime.now(timezone.utc))
    logs = settings.work / "device-tests" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    results = []
    for index, test in enumerate(tests):
        if on_test:
            on_test(test)
        stem = f"{index + 1:02d}-{test.tool}"
        started = time.monotonic()
        with (
            open(logs / f"{stem}.stdout.log", "wb") as out,
            open(logs / f"{stem}.stderr.log", "wb") as err,
        ):
            call, code = run_in_release(
                settings,
                transport,
                device,
                release,
                test.tool,
                test.args,
                env={},
                measured=measured,
                timeout=timeout,
                on_stdout=_into(out),
                on_stderr=_into(err),
            )
        result = DeviceTestResult(
            run_id=run_id,
            host_time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            recipe=recipe.name,
            patch=test.patch,
            command=test.command,
            build=BuildInfo.of_release(release, release.manifest.get("build_commit")),
            device=DeviceInfo(device.name, device.address, fingerprint),
            argv=tuple(call.argv),
            env=dict(call.env),
            returncode=code,
            passed=code == 0,
            logs=str(logs / stem),
            seconds=round(time.monotonic() - started, 3),
        )
        store.add(result)
        results.append(result)
    return results


def _into(file: BinaryIO) -> ByteSink:
    def write(chunk: bytes) -> None:
        file.write(chunk)

    return write


def device_test_store(folder: Path) -> JsonlStore[DeviceTestResult]:
    """``results/device-tests.jsonl``: one device check's result per line."""
    return JsonlStore(folder, DEVICE_TESTS_FILE, DeviceTestResult.from_dict, "device test result")
