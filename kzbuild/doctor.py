"""``kzbuild doctor``: is each target's toolchain here, and does the device answer (and allow
the symlinks and executable files deploy's store is built on)?

Versions are proven as a build proves them (kzbuild.build.toolchains); a device is reached the way
deploy reaches it, except that an adb server is only asked when one is already running.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Mapping, Sequence
from contextlib import closing

from kzbuild.adapters.settings import Settings
from kzbuild.build.builder import detect_for, target
from kzbuild.build.toolchains import Detector
from kzbuild.device.adb import adb_server_port
from kzbuild.device.base import Transport
from kzbuild.device.registry import connect
from kzbuild.device.store import store_problem
from kzbuild.errors import DeviceError
from kzbuild.model.device import Device
from kzbuild.model.doctor import DeviceCheck, DoctorReport, TargetCheck


def check_device(
    device: Device, environ: Mapping[str, str], *, connect_timeout: float = 5.0
) -> DeviceCheck:
    """Reach the device the way deploy would; an adb server is only asked if it is already
    running."""
    if device.transport == "local":
        program = device.runner_prefix[0] if device.runner_prefix else None
        if program is None:
            return DeviceCheck(device.name, "local", True, f"runs tools in {device.root}")
        path = shutil.which(program, path=environ.get("PATH", os.defpath))
        if path is None:
            return DeviceCheck(
                device.name,
                "local",
                False,
                f"'{program}' is not on PATH; device {device.name} needs it",
            )
        return DeviceCheck(device.name, "local", True, f"{device.address} through {path}")
    if device.transport == "adb":
        return check_adb_device(device, environ, connect_timeout)
    try:
        with closing(connect(device)) as transport:
            answered = f"{transport.address}: logged in; its host key matches known_hosts"
            return store_check(device, "ssh", transport, answered)
    except DeviceError as exc:
        return DeviceCheck(device.name, "ssh", False, exc.message, exc.hint)


def check_adb_device(
    device: Device, environ: Mapping[str, str], connect_timeout: float
) -> DeviceCheck:
    if shutil.which("adb", path=environ.get("PATH", os.defpath)) is None:
        return DeviceCheck(
            device.name,
            "adb",
            False,
            f"'adb' is not on PATH; device {device.name} needs it",
            hint="Debian package 'adb'",
        )
    port = adb_server_port(environ)
    if not listening("localhost", port):
        # any adb client command would start a server that outlives doctor: ask none
        return DeviceCheck(
            device.name,
            "adb",
            False,
            f"not checked: no adb server is running on port {port}, and doctor starts none",
            hint="run 'adb start-server' (or 'adb devices'), then doctor again",
        )
    try:
        with closing(
            connect(device, server_port=port, connect_timeout=connect_timeout)
        ) as transport:
            answered = f"{transport.address} online (adb server on port {port})"
            return store_check(device, "adb", transport, answered)
    except DeviceError as exc:
        return DeviceCheck(device.name, "adb", False, exc.message, exc.hint)


def store_check(device: Device, kind: str, transport: Transport, answered: str) -> DeviceCheck:
    """The device answered; not ok if its root cannot hold kzbuild's store."""
    if problem := store_problem(transport, device.root):
        return DeviceCheck(
            device.name,
            kind,
            False,
            f"{answered}, but {problem} ({device.root}): deploy needs symlinks and executable "
            "files",
            "give the device a root on a filesystem that has both, such as /data/local/tmp on "
            "Android (not /sdcard)",
        )
    return DeviceCheck(device.name, kind, True, answered)


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def doctor(
    settings: Settings,
    targets: Sequence[str],
    *,
    environ: Mapping[str, str],
    overrides: Sequence[str] = (),
    needed_by: str | None = None,
    device: Device | None = None,
) -> DoctorReport:
    """Check what each target (and the device, when one is configured) needs, naming the file or
    program that proved each version."""
    detector = Detector.for_settings(settings, environ)
    checks = []
    for name in targets:
        tgt = target(name)
        required, optional = detect_for(tgt, overrides, detector, needed_by or f"target {name}")
        checks.append(TargetCheck(name, tuple(required), tuple(optional)))
    return DoctorReport(tuple(checks), check_device(device, environ) if device else None)
