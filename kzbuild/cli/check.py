"""``kzbuild check RECIPE --device D``: the per-op device checks the recipe's patches name."""

from __future__ import annotations

import dataclasses
from contextlib import closing

import typer

from kzbuild.cli.connect import open_device
from kzbuild.cli.options import (
    DeviceOpt,
    JsonOpt,
    RecipeArg,
    TimeoutOpt,
    TrustOpt,
    WaitOpt,
    load_recipe,
)
from kzbuild.cli.ui import Column, activity, context, print_json, say_rich_table, styled
from kzbuild.device.devicelock import device_lock
from kzbuild.device.run import check_seconds
from kzbuild.errors import WrongOutput
from kzbuild.measure.devicetest import device_test_store, run_device_tests
from kzbuild.model.devicetest import DeviceTest


def register(app: typer.Typer) -> None:
    app.command("check")(check_command)


def check_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    device: DeviceOpt = None,
    timeout: TimeoutOpt = None,
    wait: WaitOpt = 0.0,
    trust_new_host: TrustOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Run the Kz-Device-Test checks of the recipe's patches on the device; store each result with
    its provenance.

    Each trailer (e.g. Kz-Device-Test: test-backend-ops -o GATED_DELTA_NET -b HTP0) runs through the
    same runner as kzbuild run: the device's current release, which must be a build of RECIPE, with
    the device env and nothing added. Results go to results/device-tests.jsonl, outputs to
    WORK/device-tests/RUN/. Exits 17 when a check fails.
    """
    settings = context(ctx).settings
    check_seconds("--timeout", timeout)
    loaded = load_recipe(settings, recipe)
    found, transport = open_device(settings, device, loaded.device, trust_new_host)
    with (
        closing(transport),
        device_lock(transport, found.root, "check", wait=wait),
        activity(f"device checks of {loaded.name} on {found.name}") as progress,
    ):

        def on_test(test: DeviceTest) -> None:
            progress(f"{test.patch}: {test.command}")

        results = run_device_tests(
            settings,
            transport,
            found,
            loaded,
            device_test_store(settings.results),
            timeout=timeout,
            on_test=on_test,
        )
    if json_out:
        print_json({"results": [dataclasses.asdict(r) for r in results]})
    else:
        say_rich_table(
            [Column(c, fold=True) for c in ("patch", "check", "result", "seconds", "output")],
            [
                (
                    r.patch,
                    r.command,
                    styled("green", "passed")
                    if r.passed
                    else styled("bold red", f"FAILED (exit {r.returncode})"),
                    f"{r.seconds:.1f}",
                    r.logs + ".*.log",
                )
                for r in results
            ],
            title=f"device checks of {loaded.name} on {found.name}, release "
            f"{results[0].build.build_id}",
        )
    failed = [r for r in results if not r.passed]
    if failed:
        raise WrongOutput(
            "; ".join(
                f"{r.patch}: {r.command} failed (exit {r.returncode}, output in "
                f"{r.logs}.stdout.log)"
                for r in failed
            )
        )
