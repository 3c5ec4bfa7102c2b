"""``kzbuild models``: GGUF models for devices."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.filesize import decimal

from kzbuild import deploy
from kzbuild.cli.deploy import DeviceOpt, TrustOpt, open_device, transfer_bars
from kzbuild.cli.sync import JsonOpt
from kzbuild.cli.ui import console, context, print_json

models_app = typer.Typer(help="GGUF models: store them on devices.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
    models_app.command("push")(push_command)


def push_command(
    ctx: typer.Context,
    model: Annotated[Path, typer.Argument(help="The GGUF file to store on the device.")],
    device: DeviceOpt = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Readable name on the device (ROOT/models/NAME). Default: the file name.")] = None,
    trust_new_host: TrustOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Store a model on a device as ROOT/models/<sha256>.gguf plus a readable name; resumes, verifies, never resends."""
    settings = context(ctx).settings
    target, transport = open_device(settings, device, None, trust_new_host)
    with closing(transport):
        with transfer_bars(not json_out) as on_progress:
            result = deploy.push_model(transport, target, model, name=name, on_progress=on_progress)
    if json_out:
        print_json(result.to_dict())
        return
    if result.already_there:
        console.print(f"[green]{model.name} is already on {result.device}[/green] as {result.path}; sent 0 bytes")
    else:
        resumed = f", resumed after {decimal(result.bytes_resumed)}" if result.bytes_resumed else ""
        console.print(f"[green]pushed[/green] {model.name} to {result.device} as {result.path} ({decimal(result.bytes_sent)} sent{resumed}, verified, {result.seconds:.2f} s)")
    console.print(f"  {result.link} -> {result.sha256}.gguf")
