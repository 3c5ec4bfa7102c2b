"""``kzbuild deploy``: send a build to a device (incremental, atomic), roll back, prune."""

from __future__ import annotations

from contextlib import closing
from typing import Annotated, Optional

import typer

from kzbuild.build.artifacts import find_artifact
from kzbuild.cli.connect import open_device
from kzbuild.cli.options import DeviceOpt, JsonOpt, RecipeArg, TrustOpt, WaitOpt, load_recipe
from kzbuild.cli.ui import (
    context,
    file_size,
    not_empty,
    print_json,
    say,
    styled,
    transfer_progress,
)
from kzbuild.device import deploy


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy_command)


def deploy_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    device: DeviceOpt = None,
    artifact: Annotated[
        Optional[str],
        typer.Option(
            "--artifact",
            callback=not_empty,
            help="A build id under the artifacts dir, or an artifact directory. Default: the "
            "recipe's newest artifact.",
        ),
    ] = None,
    rollback: Annotated[
        bool,
        typer.Option(
            "--rollback", help="Switch current back to the release that was current before it."
        ),
    ] = False,
    keep: Annotated[
        Optional[int],
        typer.Option(
            "--keep",
            min=1,
            help="Afterwards keep only the N most recently used releases (always the current one) "
            "and give up the model pushes cut a day ago or more.",
        ),
    ] = None,
    wait: WaitOpt = 0.0,
    trust_new_host: TrustOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Deploy a build to a device: only contents it lacks are sent, then `current` switches in one
    rename."""
    settings = context(ctx).settings
    loaded = None
    if recipe is not None or (artifact is None and not rollback):
        loaded = load_recipe(settings, recipe)
    if rollback and artifact is not None:
        raise typer.BadParameter(
            "--rollback switches to a release already on the device; it takes no --artifact"
        )
    target, transport = open_device(
        settings, device, loaded.device if loaded else None, trust_new_host
    )
    with closing(transport):
        if rollback:
            back = deploy.rollback(transport, target, keep=keep, wait=wait)
            if json_out:
                print_json(back.to_dict())
                return
            say(
                styled("green", "rolled back"),
                f" {back.device}: current -> releases/{back.release} (was {back.previous})",
            )
            _print_pruned(back.pruned)
            return
        build = find_artifact(settings, artifact, loaded)
        with transfer_progress(not json_out) as on_progress:
            result = deploy.deploy(
                transport, target, build, keep=keep, on_progress=on_progress, wait=wait
            )
    if json_out:
        print_json(result.to_dict())
        return
    if result.switched:
        say(
            styled("green", "deployed"),
            f" {result.build_id} to {result.device}: current -> "
            f"releases/{result.release} (was {result.previous or 'nothing'})",
        )
    else:
        say(
            styled("green", f"{result.build_id} is already current"),
            f" on {result.device} (releases/{result.release})",
        )
    resumed = (
        f" ({file_size(result.bytes_resumed)} had arrived before a cut)"
        if result.bytes_resumed
        else ""
    )
    say(
        f"  sent {result.files_sent} file(s), {file_size(result.bytes_sent)}{resumed}; "
        f"skipped {result.files_skipped} already on the device, "
        f"{file_size(result.bytes_skipped)}; "
        f"metadata {file_size(result.metadata_bytes)}; {result.seconds:.2f} s"
    )
    if result.repaired:
        say(
            "  ",
            styled("yellow", "repaired"),
            f" {len(result.repaired)} damaged file(s), re-sent and "
            f"relinked: {', '.join(result.repaired)}",
        )
    _print_pruned(result.pruned)


def _print_pruned(pruned: tuple[str, ...]) -> None:
    if pruned:
        say(f"  pruned {len(pruned)} old release(s): {', '.join(pruned)}")
