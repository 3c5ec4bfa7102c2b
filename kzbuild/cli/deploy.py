"""``kzbuild deploy``: send a build to a device (incremental, atomic), roll back, prune."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import Annotated, Optional

import typer
from rich.filesize import decimal
from rich.markup import escape

from kzbuild import deploy, recipes
from kzbuild.artifacts import find_artifact
from kzbuild.cli.complete import complete_device
from kzbuild.cli.sync import DEFAULT_RECIPE, JsonOpt, RecipeArg
from kzbuild.cli.ui import ProgressLines, console, context, err_console, not_empty, print_json
from kzbuild.devices.base import Transport
from kzbuild.devices.registry import connect, resolve_device
from kzbuild.devices.store import TransferProgress
from kzbuild.model.device import Device
from kzbuild.run import check_seconds
from kzbuild.settings import Settings

DeviceOpt = Annotated[
    Optional[str],
    typer.Option("--device", "-d", callback=not_empty, help="A device name from recipes/devices.yaml, adb:SERIAL[:ROOT], ssh://user@host:port/ROOT or local:/path. Default: the recipe's device, else local.", autocompletion=complete_device),
]
def finite_wait(value: float) -> float:
    """typer callback: click's range check lets nan and inf through, and a nan wait never ends."""
    check_seconds("--wait", value, zero_ok=True)
    return value


WaitOpt = Annotated[
    float,
    typer.Option("--wait", min=0, callback=finite_wait, help="Seconds to wait while another kzbuild writes to the device root (it holds ROOT/.lock), then exit 10. Default 0: exit 10 at once."),
]
TrustOpt = Annotated[bool, typer.Option("--trust-new-host", help="ssh: accept and store an unknown host key on first use (a changed key is always refused).")]


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy_command)


def open_device(settings: Settings, spec: str | None, default: str | None, trust_new_host: bool) -> tuple[Device, Transport]:
    device = resolve_device(settings, spec, default)
    options = {"trust_new_host": trust_new_host} if device.transport == "ssh" else {}
    return device, connect(device, **options)


@contextmanager
def transfer_bars(enabled: bool) -> Iterator[Callable[[TransferProgress], None] | None]:
    """A progress bar with bytes and rate for an upload (in logs and pipes, ProgressLines); nothing when ``enabled`` is false."""
    if not enabled:
        yield None
        return
    if not err_console.is_terminal:  # bars show nothing in logs and pipes
        with ProgressLines("upload") as lines:
            yield lambda event: lines.update("sending", f"{event.done * 100 // max(event.total, 1)}% ({event.done}/{event.total} bytes) {event.label}")
        return
    # imported here: rich.progress costs every kzbuild start-up ~60 ms otherwise
    from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=True) as bars:
        task: TaskID | None = None

        def update(event: TransferProgress) -> None:
            nonlocal task
            if task is None:
                task = bars.add_task(event.label, total=event.total)
            bars.update(task, completed=event.done, description=event.label[-40:])

        yield update


def deploy_command(
    ctx: typer.Context,
    recipe: RecipeArg = None,
    device: DeviceOpt = None,
    artifact: Annotated[Optional[str], typer.Option("--artifact", callback=not_empty, help="A build id under the artifacts dir, or an artifact directory. Default: the recipe's newest artifact.")] = None,
    rollback: Annotated[bool, typer.Option("--rollback", help="Switch current back to the release that was current before it.")] = False,
    keep: Annotated[Optional[int], typer.Option("--keep", min=1, help="Afterwards keep only the N most recently used releases (always the current one).")] = None,
    wait: WaitOpt = 0.0,
    trust_new_host: TrustOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Deploy a build to a device: only contents it lacks are sent, then `current` switches in one rename."""
    settings = context(ctx).settings
    loaded = None
    if recipe is not None or (artifact is None and not rollback):
        loaded = recipes.load_recipe(settings.project, recipe or DEFAULT_RECIPE)
    if rollback and artifact is not None:
        raise typer.BadParameter("--rollback switches to a release already on the device; it takes no --artifact")
    target, transport = open_device(settings, device, loaded.device if loaded else None, trust_new_host)
    with closing(transport):
        if rollback:
            back = deploy.rollback(transport, target, keep=keep, wait=wait)
            if json_out:
                print_json(back.to_dict())
                return
            console.print(f"[green]rolled back[/green] {back.device}: current -> releases/{back.release} (was {back.previous})")
            _print_pruned(back.pruned)
            return
        build = find_artifact(settings, artifact, loaded)
        with transfer_bars(not json_out) as on_progress:
            result = deploy.deploy(transport, target, build, keep=keep, on_progress=on_progress, wait=wait)
    if json_out:
        print_json(result.to_dict())
        return
    if result.switched:
        console.print(f"[green]deployed[/green] {result.build_id} to {result.device}: current -> releases/{result.release} (was {result.previous or 'nothing'})")
    else:
        console.print(f"[green]{result.build_id} is already current[/green] on {result.device} (releases/{result.release})")
    resumed = f" ({decimal(result.bytes_resumed)} had arrived before a cut)" if result.bytes_resumed else ""
    console.print(
        f"  sent {result.files_sent} file(s), {decimal(result.bytes_sent)}{resumed}; "
        f"skipped {result.files_skipped} already on the device, {decimal(result.bytes_skipped)}; "
        f"metadata {decimal(result.metadata_bytes)}; {result.seconds:.2f} s"
    )
    if result.repaired:
        console.print(f"  [yellow]repaired[/yellow] {len(result.repaired)} damaged file(s), re-sent and relinked: {escape(', '.join(result.repaired))}")
    _print_pruned(result.pruned)


def _print_pruned(pruned: tuple[str, ...]) -> None:
    if pruned:
        console.print(f"  pruned {len(pruned)} old release(s): {', '.join(pruned)}")
