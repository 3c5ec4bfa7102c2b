"""``kzbuild device``: checks of what is stored on a device."""

from __future__ import annotations

from contextlib import closing

import typer

from kzbuild.cli.connect import open_device
from kzbuild.cli.options import DeviceOpt, JsonOpt, TrustOpt, WaitOpt
from kzbuild.cli.ui import command_group, context, file_size, print_json, say, styled
from kzbuild.device.devicelock import device_lock
from kzbuild.device.integrity import verify_store
from kzbuild.device.store import Layout, Remote
from kzbuild.errors import DeviceError

device_app = command_group(
    "device",
    "Devices: list them with their pools and lock holders, check what is stored on one and the "
    "space it holds.",
)


def register(app: typer.Typer) -> None:
    app.add_typer(device_app, name="device")
    device_app.command("verify")(verify_command)
    device_app.command("list")(list_command)
    device_app.command("status")(status_command)


def list_command(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Every named device and pool member: its address, its pools, and who holds its lock (or why it
    cannot be reached).

    Each device is asked once (read only: no lock is taken). A lock whose holder is gone counts as
    free: the next operation breaks it.
    """
    from kzbuild.device.devicelock import holder, is_busy
    from kzbuild.device.registry import connect, load_registry
    from kzbuild.errors import KzError

    devices, pools = load_registry(context(ctx).settings)
    rows = []
    for name, device in devices.items():
        entry: dict[str, object] = {
            "name": name,
            "address": device.address,
            "pools": [p for p, members in pools.items() if name in members],
        }
        try:
            with closing(
                connect(device, **({"connect_timeout": 5.0} if device.transport == "adb" else {}))
            ) as transport:
                sighting = holder(transport, device.root)
        except KzError as exc:
            entry |= {"state": "unreachable", "detail": exc.message.splitlines()[0]}
        else:
            owner = (
                sighting.owner.describe()
                if sighting and sighting.owner
                else "a lock being taken"
                if sighting
                else ""
            )
            state = "busy" if is_busy(sighting) else "free"
            entry |= {
                "state": state,
                "holder": owner or None,
                "detail": f"stale lock of {owner}" if sighting and state == "free" else "",
            }
        rows.append(entry)
    if json_out:
        print_json(
            {"devices": rows, "pools": {name: list(members) for name, members in pools.items()}}
        )
        return
    for row in rows:
        pools_text = f" [pool {', '.join(map(str, row['pools']))}]" if row["pools"] else ""  # type: ignore[call-overload]
        holder_text = (
            f": held by {row['holder']}"
            if row["state"] == "busy"
            else f": {row['detail']}"
            if row["detail"]
            else ""
        )
        say(f"{row['name']}{pools_text} {row['address']} {row['state']}{holder_text}")


def verify_command(
    ctx: typer.Context,
    device: DeviceOpt = None,
    trust_new_host: TrustOpt = False,
    wait: WaitOpt = 0.0,
    json_out: JsonOpt = False,
) -> None:
    """Hash the device's whole store: every content, chunk, release's files and model; exit 8 if
    anything is damaged.

    Damaged releases are marked, so run and bench refuse them until kzbuild deploy repairs them;
    damaged chunks are removed (a deploy sends them again when it needs them).
    """
    target, transport = open_device(context(ctx).settings, device, None, trust_new_host)
    # under the device lock: a deploy in flight would race it on the damage markers
    with closing(transport), device_lock(transport, target.root, "verify", wait=wait):
        report = verify_store(Remote(transport), Layout(target.root))
    if json_out:
        print_json(report.to_dict())
    else:
        checked = (
            f"{report.objects} content(s), {report.chunks} chunk(s), {report.releases} release(s), "
            f"{report.models} model(s) under {report.root}"
        )
        if report.ok:
            say(styled("green", "all intact"), f" on {report.device}: {checked}")
        for entry in report.damage:
            say(
                styled("red", "damaged"),
                f" {entry.kind} {entry.name}: {entry.path}: "
                f"expected {entry.expected}, found {entry.found}",
            )
    if not report.ok:
        releases = ", ".join(report.damaged_releases) or "none"
        raise DeviceError(
            f"{report.device}: {len(report.damage)} damaged file(s) in the store (damaged "
            f"releases: {releases})",
            hint="kzbuild deploy of a damaged release's build re-sends what is damaged; run and "
            "bench refuse a damaged release until then",
        )


def status_command(
    ctx: typer.Context,
    device: DeviceOpt = None,
    trust_new_host: TrustOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """The space each release and model holds on a device, and what deploy --keep N would free.

    A content that several releases share is one file (each release's manifest lists it, and the
    release links it): each release counts it in what it holds, none counts it as its own (a
    release's own contents are those no other release holds), and the contents total counts it
    once.
    A model under several names is stored once; models pushed with --split share the splits they
    have in common (a model's own bytes are those no other model holds). Read only: no lock is
    taken.
    """
    from kzbuild.device.space import space

    target, transport = open_device(context(ctx).settings, device, None, trust_new_host)
    with closing(transport):
        report = space(Remote(transport), Layout(target.root))
    if json_out:
        print_json(report.to_dict())
        return
    say(f"{report.device} {report.root}: {file_size(report.total)} in the store")
    links = "hard links" if report.hard_links else "symlinks (the device refuses hard links)"
    say(
        f"releases, most recent first ({file_size(report.contents)} of contents, each once, "
        f"linked by {links}; holds: every content it lists, own: the ones no other release "
        "holds)"
    )
    for release in report.releases:
        mark = "*" if release.current else " "
        say(
            f"  {mark} {release.name}: holds {file_size(release.holds)}, "
            f"own {file_size(release.own)}"
        )
    say(f"chunks kept to send deltas: {file_size(report.chunks)}")
    say(
        f"models ({file_size(report.model_files)}, each file once; holds: its files, own: the "
        "ones no other model holds)"
    )
    for model in report.models:
        names = ", ".join(model.names) or "no name"
        kept = f"{model.splits} splits" if model.splits > 1 else "one file"
        say(
            f"    {model.sha256[:12]}.gguf: holds {file_size(model.size)}, own "
            f"{file_size(model.own)}, {kept} ({names})"
        )
    if report.incoming:
        say(
            f"cut uploads waiting to resume: {file_size(report.incoming)} (--keep gives up the "
            "model pushes nothing touched for a day)"
        )
    for keep in report.keeps:
        say(
            f"deploy --keep {keep.keep} would remove {len(keep.removes)} release(s) and free "
            f"{file_size(keep.frees)} (models are never pruned)"
        )
