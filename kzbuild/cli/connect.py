"""Opening the device a command names."""

from __future__ import annotations

from contextlib import ExitStack, closing

from kzbuild.adapters.settings import Settings
from kzbuild.cli.ui import say
from kzbuild.device.base import Transport
from kzbuild.device.devicelock import holder, is_busy
from kzbuild.device.registry import connect, resolve_device, resolve_devices
from kzbuild.errors import Busy
from kzbuild.model.device import Device


def open_device(
    settings: Settings, spec: str | None, default: str | None, trust_new_host: bool
) -> tuple[Device, Transport]:
    device = resolve_device(settings, spec, default)
    options = {"trust_new_host": trust_new_host} if device.transport == "ssh" else {}
    return device, connect(device, **options)


def open_pool(
    settings: Settings,
    spec: str | None,
    default: str | None,
    trust_new_host: bool,
    opened: ExitStack,
) -> list[tuple[Device, Transport]]:
    """The free members of the pool ``spec`` names, each opened (and closed with ``opened``); the
    one device ``spec`` names otherwise. A member another kzbuild holds is left out, and said so
    (a single device is not asked: its lock, with --wait, answers); Busy when all are held."""
    members = resolve_devices(settings, spec, default)
    if len(members) == 1:
        device, transport = open_device(settings, spec, default, trust_new_host)
        opened.enter_context(closing(transport))
        return [(device, transport)]
    free = []
    for member in members:
        device, transport = open_device(settings, member.name, None, trust_new_host)
        opened.enter_context(closing(transport))
        sighting = holder(transport, device.root)
        if is_busy(sighting):
            owner = sighting.owner.describe() if sighting and sighting.owner else "held"
            say(f"{device.name}: busy ({owner}); the pool goes on without it", err=True)
            continue
        free.append((device, transport))
    if not free:
        raise Busy(
            f"every device of the pool is busy: {', '.join(m.name for m in members)}",
            hint="kzbuild device list shows who holds each one; --wait on a single device waits",
        )
    return free
