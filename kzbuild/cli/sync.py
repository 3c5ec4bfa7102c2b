"""``kzbuild sync``, ``kzbuild status`` and ``kzbuild recipes``."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from kzbuild.cli.options import JsonOpt, RecipeArg, load_recipe
from kzbuild.cli.ui import Styled, activity, context, print_json, say, say_table, styled
from kzbuild.model.sync import Discarded
from kzbuild.source import recipes, sync

SHOWN = 20  # lines of each kind of discarded work


def register(app: typer.Typer) -> None:
    app.command("sync")(sync_command)
    app.command("status")(status_command)
    app.command("recipes")(recipes_command)


def sync_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Discard uncommitted changes, unexported commits and ignored files in the way; "
            "they are kept under refs/kz/discarded/<time>.",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Fetch the pinned upstream commit, apply the patch series as commits, overlay kernels/, write
    the lock."""
    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    with activity(f"syncing {loaded.name}") as progress:
        result = sync.sync(settings, loaded, force=force, progress=progress)
    discarded = result.discarded
    if json_out:
        print_json(
            {
                "changed": result.changed,
                "discarded": asdict(discarded) if discarded else None,
                **sync.status(settings, loaded).to_dict(),
            }
        )
        return
    if discarded:
        print_discarded(discarded, result.worktree)
    lock = result.lock
    if not result.changed:
        say(styled("green", loaded.name), f" is up to date at {lock.head[:12]} ({result.worktree})")
        return
    say(styled("green", f"synced {loaded.name}"), f" -> {result.worktree}")
    say(f"  upstream {lock.upstream_commit[:12]} from {result.fetched_from or 'the cache'}")
    for patch in lock.patches:
        if patch.commit:
            say(f"  applied {patch.file} as {patch.commit[:12]}")
        else:
            say(
                "  ",
                styled("yellow", "skipped"),
                f" {patch.file}: already upstream ({patch.upstreamed})",
            )
    if lock.overlay_commit:
        say(f"  overlays committed as {lock.overlay_commit[:12]}")
    if result.interrupted:
        say(
            f"  picked up a sync of {result.interrupted.pin[:12]} that was interrupted (its "
            "leftovers were its own)"
        )
    say(f"  head {lock.head[:12]}; lock {loaded.lock_path.relative_to(settings.project)}")


def print_discarded(discarded: Discarded, worktree: Path) -> None:
    """What --force took out of the worktree, and how to get it back."""
    git = f"git -C {worktree}"
    say(styled("yellow", "discarded"), f" (kept under {discarded.ref}):")
    for kind, lines in (
        ("uncommitted", discarded.changes),
        ("ignored", discarded.ignored),
        ("commit", discarded.commits),
    ):
        for line in lines[:SHOWN]:
            say(f"  {kind:12} {line}")
        if (
            len(lines) > SHOWN
        ):  # without a base ref every commit on HEAD counts: possibly all of upstream's
            say(f"  {kind:12} ... and {len(lines) - SHOWN} more")
    if discarded.snapshot:
        say(f"  get a file back:   {git} restore --source={discarded.ref} -- PATH")
    if discarded.commits:
        say(f"  get the commits:   {git} branch rescued {discarded.commits_ref}")


def status_command(ctx: typer.Context, recipe: RecipeArg = None, json_out: JsonOpt = False) -> None:
    """Show the pin, the source used, applied patches and the worktree state of a recipe."""
    settings = context(ctx).settings
    loaded = load_recipe(settings, recipe)
    status = sync.status(settings, loaded)
    if json_out:
        print_json(status.to_dict())
        return
    worktree = status.worktree
    rows: list[tuple[str | Styled, ...]] = [
        ("recipe", status.recipe.name),
        ("pin", status.recipe.upstream.commit),
        ("source", status.lock.fetched_from if status.lock else "not synced"),
        ("worktree", f"{worktree.path} ({worktree.word})"),
        ("matches lock", "yes")
        if status.matches_lock
        else ("matches lock", styled("yellow", "no"), " (run kzbuild sync)"),
    ]
    for patch in status.lock.patches if status.lock else ():
        applied = patch.commit[:12] if patch.commit else f"skipped, upstreamed ({patch.upstreamed})"
        rows.append(("patch", f"{patch.file}  {applied}"))
    if worktree.interrupted:
        rows.append(
            (
                styled("yellow", "interrupted"),
                "a sync was killed halfway; 'kzbuild sync' finishes it (its leftovers are its own)",
            )
        )
    rows += [
        (styled("yellow", "unsaved"), line) for line in worktree.user_changes + worktree.unexported
    ]
    say_table(rows)


def recipes_command(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """List the recipes of this project."""
    settings = context(ctx).settings
    names = recipes.list_recipes(settings.recipes)
    if json_out:
        print_json(names)
        return
    for name in names:
        loaded = recipes.load_recipe(settings.project, name)
        say(f"{name:28} {loaded.upstream.commit[:12]}  {loaded.description}")
