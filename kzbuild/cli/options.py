"""Options and arguments that several commands share, defined once so they read the same
everywhere."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from kzbuild.adapters.settings import Settings
from kzbuild.cli.complete import complete_device, complete_recipe
from kzbuild.cli.ui import not_empty
from kzbuild.model.recipe import Recipe
from kzbuild.source import recipes

DEFAULT_RECIPE = "demo-host"


def load_recipe(settings: Settings, name: str | None) -> Recipe:
    """The recipe a command was given, or the built-in default."""
    return recipes.load_recipe(settings.project, name or DEFAULT_RECIPE)


def append_step_summary(markdown: str) -> None:
    """Append ``markdown`` to the file $GITHUB_STEP_SUMMARY names (GitHub Actions' job summary),
    when it is set."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(markdown)


def finite_wait(value: float) -> float:
    """typer callback: click's range check lets nan and inf through, and a nan wait never ends."""
    from kzbuild.device.run import (
        check_seconds,
    )  # the device modules it needs load only when --wait is given

    check_seconds("--wait", value, zero_ok=True)
    return value


RecipeArg = Annotated[
    Optional[str],
    typer.Argument(
        callback=not_empty,
        help=f"Recipe name (recipes/NAME.yaml) or path. Default: {DEFAULT_RECIPE}.",
        autocompletion=complete_recipe,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
MarkdownOpt = Annotated[
    bool, typer.Option("--markdown", help="A markdown table instead of a rich one.")
]
DeviceOpt = Annotated[
    Optional[str],
    typer.Option(
        "--device",
        "-d",
        callback=not_empty,
        autocompletion=complete_device,
        help="A device name from recipes/devices.yaml, adb:SERIAL[:ROOT], "
        "ssh://user@host:port/ROOT or local:/path. Default: the recipe's device where the "
        "command takes a recipe, else local.",
    ),
]
WaitOpt = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        callback=finite_wait,
        help="Seconds to wait while another kzbuild writes to the device root (it holds "
        "ROOT/.lock), then exit 10. Default 0: exit 10 at once.",
    ),
]
TrustOpt = Annotated[
    bool,
    typer.Option(
        "--trust-new-host",
        help="ssh: accept and store an unknown host key on first use (a changed key is always "
        "refused).",
    ),
]
EnvOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--env",
        "-e",
        help="NAME=VALUE added to the device env (repeatable); passed exactly, never through a "
        "shell unquoted.",
    ),
]
TimeoutOpt = Annotated[
    Optional[float], typer.Option("--timeout", help="Seconds before the tool is killed.")
]
NoRemoteOpt = Annotated[
    bool,
    typer.Option(
        "--no-remote-cache",
        help="Use only this machine's caches, whatever KZ_REMOTE_CACHE or .kz/config.yaml say.",
    ),
]
