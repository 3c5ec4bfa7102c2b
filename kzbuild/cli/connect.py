"""Opening the device a command names."""

from __future__ import annotations

from kzbuild.adapters.settings import Settings
from kzbuild.device.base import Transport
from kzbuild.device.registry import connect, resolve_device
from kzbuild.model.device import Device


def open_device(
    settings: Settings, spec: str | None, default: str | None, trust_new_host: bool
) -> tuple[Device, Transport]:
    device = resolve_device(settings, spec, default)
    options = {"trust_new_host": trust_new_host} if device.transport == "ssh" else {}
    return device, connect(device, **options)
