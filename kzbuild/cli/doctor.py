"""``kzbuild doctor``."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from kzbuild.build import builder
from kzbuild.cli.build import ToolchainOpt
from kzbuild.cli.complete import complete_device, complete_recipe
from kzbuild.cli.options import JsonOpt
from kzbuild.cli.ui import (
    Cell,
    context,
    not_empty,
    print_json,
    say,
    say_rich_table,
    styled,
)
from kzbuild.device.registry import resolve_device
from kzbuild.doctor import doctor
from kzbuild.errors import ToolchainMissing
from kzbuild.model.build import V79_CHECK_TARGET
from kzbuild.model.doctor import DeviceCheck, TargetCheck
from kzbuild.model.toolchain import Found
from kzbuild.source import recipes


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)


DoctorTargetOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--target",
        "-t",
        help=f"Target: {', '.join(builder.TARGETS)} (repeatable). Default: the recipe's targets. "
        f"({V79_CHECK_TARGET} needs only the ziglang package and ccache.)",
    ),
]

DoctorRecipeArg = Annotated[
    Optional[str],
    typer.Argument(
        callback=not_empty,
        help="Recipe whose targets and device to check. Default: no recipe: every target, no "
        "device.",
        autocompletion=complete_recipe,
    ),
]


def doctor_command(
    ctx: typer.Context,
    recipe: DoctorRecipeArg = None,
    target: DoctorTargetOpt = None,
    toolchain: ToolchainOpt = None,
    device: Annotated[
        Optional[str],
        typer.Option(
            "--device",
            "-d",
            callback=not_empty,
            help="Also check that this device answers (default: the recipe's device).",
            autocompletion=complete_device,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check the toolchains, cmake, ninja and ccache a target needs, naming the file that proved
    each version.

    With no arguments it checks every target and no device, and only reports (exit 0).

    With a recipe (or --device) it also checks that the device answers: an adb device must be online
    in an adb server that is already running (doctor starts none); an ssh device must accept a login
    whose host key matches known_hosts; a local device's runner must be on PATH. An adb or ssh
    device's root must allow symlinks and executable files, which deploy's store needs (a
    FUSE-backed /sdcard allows neither).

    Exits 6 when a target or device that was asked for (a recipe, --target or --device) is not
    ready.
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
        names = list(target or builder.TARGETS)
    resolved = resolve_device(settings, device_spec) if device_spec else None
    report = doctor(
        settings,
        names,
        environ=os.environ,
        overrides=toolchain or (),
        needed_by=needed_by,
        device=resolved,
    )
    if json_out:
        print_json(report.to_dict())
    else:
        for check in report.targets:
            render_target_check(check)
        if report.device is not None:
            render_device_check(report.device)
    if not report.ok and (recipe or target or device):
        not_ready = ", ".join(
            [t.target for t in report.targets if not t.ok]
            + ([f"device {report.device.device}"] if report.device and not report.device.ok else [])
        )
        raise ToolchainMissing(
            f"not ready to build: {not_ready}",
            hint="install what is marked missing or not ok above, or point kzbuild at it "
            "(toolchains/README.md); a device's own hint is above",
        )


def render_device_check(check: DeviceCheck) -> None:
    state = styled("green", "ok") if check.ok else styled("red", "not ok")
    say(
        styled("bold", "device"),
        f" {check.device} ({check.transport}): ",
        state,
        f": {check.detail}",
    )
    if check.hint:
        say("  ", styled("yellow", "hint:"), f" {check.hint}")


def render_target_check(check: TargetCheck) -> None:
    state = styled("green", "ready") if check.ok else styled("red", "not ready")
    say(
        styled("bold", check.target),
        f" ({builder.TARGETS[check.target].description}): ",
        state,
    )
    say_rich_table(
        ("toolchain", "status", "version", "proven by"),
        [
            *(toolchain_row(found, optional=False) for found in check.required),
            *(toolchain_row(found, optional=True) for found in check.optional),
        ],
        bare=True,
    )
    for found in [*check.required, *check.optional]:
        for problem in found.problems:
            colour = "dim" if found in check.optional else "red"
            say("  ", styled(colour, f"{found.name}: {problem}"))
        for note in found.notes:
            say("  ", styled("dim", f"{found.name}: {note}"))
    say()


def toolchain_row(found: Found, *, optional: bool) -> tuple[str, Cell, str, str]:
    status: Cell
    if found.ok:
        status = (styled("green", "ok"), " (optional)" if optional else "")
    else:
        status = styled("dim", "absent (optional)") if optional else styled("red", "missing")
    versions = ", ".join(f"{label} {version}" for label, version in found.versions) or (
        found.version or ""
    )
    return found.name, status, versions, found.proof or ""
