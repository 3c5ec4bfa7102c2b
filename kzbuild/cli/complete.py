"""Shell completion of recipe names, device names and run ids, from local files only: no
network, no git. A failure offers nothing rather than printing into the user's shell.

Each completer imports what it reads when it runs: every command that declares an option with
completion imports this module, and should not pay for the results store or the device registry."""

from __future__ import annotations

import typer

from kzbuild.adapters.settings import Settings
from kzbuild.cli.ui import resolve_settings
from kzbuild.errors import KzError


def _settings(ctx: typer.Context) -> Settings:
    """The settings the command would use; the root callback has not run while completing."""
    return resolve_settings(ctx.find_root().params)


def complete_recipe(ctx: typer.Context, incomplete: str) -> list[str]:
    from kzbuild.source import recipes

    try:
        names = recipes.list_recipes(_settings(ctx).recipes)
    except (KzError, OSError):
        return []
    return [name for name in names if name.startswith(incomplete)]


def complete_target(incomplete: str) -> list[str]:
    """What --target of build and ci takes (the module that declares it has loaded the builder)."""
    from kzbuild.build.builder import BUILD_TARGETS

    return [name for name in BUILD_TARGETS if name.startswith(incomplete)]


def complete_device(ctx: typer.Context, incomplete: str) -> list[str]:
    from kzbuild.device.registry import load_devices

    try:
        names = list(load_devices(_settings(ctx)))
    except (KzError, OSError):
        return []
    return [name for name in names if name.startswith(incomplete)]


def complete_run(ctx: typer.Context, incomplete: str) -> list[str]:
    """Run ids (newest last) and 'latest'; a results dir that is not there is not created."""
    from kzbuild.measure import resultfiles, resultsdb

    try:
        folder, _ = resultfiles.reading_dir(_settings(ctx))  # the dir `results show` would read
        if not folder.is_dir():
            return []
        with resultsdb.ResultsStore(folder) as store:
            names = [run.run_id for run in store.runs()] + [resultsdb.LATEST]
    except (KzError, OSError):
        return []
    return [name for name in names if name.startswith(incomplete)]
