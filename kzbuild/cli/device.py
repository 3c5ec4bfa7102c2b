"""``kzbuild device``: checks of what is stored on a device."""

from __future__ import annotations

from contextlib import closing

import typer
from rich.markup import escape

from kzbuild.cli.connect import open_device
from kzbuild.cli.options import DeviceOpt, JsonOpt, TrustOpt, WaitOpt
from kzbuild.cli.ui import command_group, console, context, print_json
from kzbuild.device.devicelock import device_lock
from kzbuild.device.integrity import verify_store
from kzbuild.device.store import Layout, Remote
from kzbuild.errors import DeviceError

device_app = command_group("device", "Check what is stored on a device.")


def register(app: typer.Typer) -> None:
    app.add_typer(device_app, name="device")
    device_app.command("verify")(verify_command)


def verify_command(ctx: typer.Context, device: DeviceOpt = None, trust_new_host: TrustOpt = False, wait: WaitOpt = 0.0, json_out: JsonOpt = False) -> None:
    """Hash the device's whole store: every content, chunk, release's files and model; exit 8 if anything is damaged.

    Damaged releases are marked, so run and bench refuse them until kzbuild deploy repairs them; damaged chunks are removed (a deploy sends them again when it needs them).
    """
    target, transport = open_device(context(ctx).settings, device, None, trust_new_host)
    # under the device lock: a deploy in flight would race it on the damage markers
    with closing(transport), device_lock(transport, target.root, "verify", wait=wait):
        report = verify_store(Remote(transport), Layout(target.root))
    if json_out:
        print_json(report.to_dict())
    else:
        checked = f"{report.objects} content(s), {report.chunks} chunk(s), {report.releases} release(s), {report.models} model(s) under {escape(report.root)}"
        if report.ok:
            console.print(f"[green]all intact[/green] on {escape(report.device)}: {checked}")
        for entry in report.damage:
            console.print(f"[red]damaged[/red] {entry.kind} {escape(entry.name)}: {escape(entry.path)}: expected {escape(entry.expected)}, found {escape(entry.found)}")
    if not report.ok:
        releases = ", ".join(report.damaged_releases) or "none"
        raise DeviceError(
            f"{report.device}: {len(report.damage)} damaged file(s) in the store (damaged releases: {releases})",
            hint="kzbuild deploy of a damaged release's build re-sends what is damaged; run and bench refuse a damaged release until then",
        )
