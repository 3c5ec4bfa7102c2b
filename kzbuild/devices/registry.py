"""Named devices (``recipes/devices.yaml``), ad-hoc device specs, and opening a transport.

Ad-hoc specs on the command line: ``adb:SERIAL[:ROOT]``, ``ssh://user@host:port/ROOT``,
``local:/path``. A name is looked up in the devices file; ``local`` is built in (a staging
dir under the work dir).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from kzbuild import yamlconf
from kzbuild.devices.base import Transport, check_env_name
from kzbuild.errors import ConfigError
from kzbuild.model.device import DEFAULT_ROOT, Device
from kzbuild.settings import Settings

DEVICES_FILE = "devices.yaml"  # in recipes/
DEVICE_KEYS = ("description", "transport", "serial", "host", "port", "user", "key", "root", "env", "runner")
DEFAULT_ENV = (("LD_LIBRARY_PATH", "{current}/lib"), ("ADSP_LIBRARY_PATH", "{current}/lib"))
ADB_SPEC = re.compile(r"^adb:(?P<serial>[^:/]+(?::\d+)?)(?::(?P<root>/.*))?$")


def devices_file(settings: Settings) -> Path:
    return settings.recipes / DEVICES_FILE


def load_devices(settings: Settings) -> dict[str, Device]:
    path = devices_file(settings)
    devices = {"local": local_device(settings)}
    if not path.is_file():
        return devices
    doc = yamlconf.load(path)
    doc.check_keys(("devices",), required=("devices",), context="devices file")
    for name, entry in doc.get_mapping("devices").items():
        if not isinstance(entry, yamlconf.Mapping):
            raise doc.get_mapping("devices").error(name, "a device is a mapping")
        devices[name] = parse_device(name, entry)
    return devices


def parse_device(name: str, entry: yamlconf.Mapping) -> Device:
    entry.check_keys(DEVICE_KEYS, required=("transport",), context=f"device {name}")
    transport = entry.get_str("transport")
    if transport not in ("adb", "ssh", "local"):
        raise entry.error("transport", f"'{transport}' is not one of adb, ssh, local")
    if transport == "adb" and not entry.get("serial"):
        raise entry.error(None, f"adb device {name} needs a serial")
    if transport == "ssh" and not entry.get("host"):
        raise entry.error(None, f"ssh device {name} needs a host")
    env_section = entry.get_mapping("env")
    env = []
    for key, value in env_section.items():
        try:
            check_env_name(key)
        except ValueError as exc:
            raise env_section.error(key, str(exc)) from exc
        env.append((key, str(value)))
    runner = entry.get_list("runner")
    port = entry.get("port", 22)
    if not isinstance(port, int):
        raise entry.error("port", "must be a number")
    root = entry.get_str("root", DEFAULT_ROOT) or DEFAULT_ROOT
    if not root.startswith("/"):
        raise entry.error("root", f"device {name}: '{root}' is not an absolute path (the store's paths would depend on the directory a command starts in)")
    return Device(
        name=name,
        transport=transport,  # type: ignore[arg-type]
        root=root,
        serial=entry.get_str("serial"),
        host=entry.get_str("host"),
        port=port,
        user=entry.get_str("user"),
        key=entry.get_str("key"),
        env=tuple(env) if "env" in entry else DEFAULT_ENV,
        runner_prefix=tuple(str(arg) for arg in runner),
        description=entry.get_str("description", "") or "",
    )


def local_device(settings: Settings, root: str | None = None) -> Device:
    return Device(
        name="local",
        transport="local",
        root=root or str(settings.work / "device"),
        env=DEFAULT_ENV,
        description="this machine, staging under the work dir",
    )


def parse_device_spec(spec: str) -> Device | None:
    """An ad-hoc device from ``adb:``, ``ssh://`` or ``local:`` specs; None for a plain name."""
    if spec.startswith("adb:"):
        match = ADB_SPEC.match(spec)
        if not match:
            raise ConfigError(f"bad adb device spec '{spec}'", hint="use adb:SERIAL or adb:SERIAL:/root/path")
        return Device(name=spec, transport="adb", serial=match["serial"], root=match["root"] or DEFAULT_ROOT, env=DEFAULT_ENV)
    if spec.startswith("ssh://"):
        parts = urlsplit(spec)
        if not parts.hostname:
            raise ConfigError(f"bad ssh device spec '{spec}'", hint="use ssh://user@host:port/root/path")
        return Device(
            name=spec,
            transport="ssh",
            host=parts.hostname,
            port=parts.port or 22,
            user=unquote(parts.username) if parts.username else None,
            root=unquote(parts.path) if parts.path not in ("", "/") else DEFAULT_ROOT,
            env=DEFAULT_ENV,
        )
    if spec.startswith("local:"):
        root = spec.removeprefix("local:")
        if not root.startswith("/"):
            raise ConfigError(f"bad local device spec '{spec}'", hint="use local:/absolute/path")
        return Device(name=spec, transport="local", root=root, env=DEFAULT_ENV)
    return None


def resolve_device(settings: Settings, spec: str | None, default: str | None = None) -> Device:
    """The device named by ``spec`` (or the recipe's ``default``, else ``local``)."""
    wanted = spec or default or "local"
    adhoc = parse_device_spec(wanted)
    if adhoc is not None:
        return adhoc
    devices = load_devices(settings)
    if wanted not in devices:
        raise ConfigError(
            f"no device named '{wanted}' in {devices_file(settings)}",
            hint=f"known devices: {', '.join(sorted(devices))}; or use adb:SERIAL, ssh://user@host:port/ROOT, local:/path",
        )
    return devices[wanted]


def device_env(device: Device, current: str) -> dict[str, str]:
    """The device's default env with ``{current}`` expanded to the current release dir."""
    return {key: value.replace("{current}", current) for key, value in device.env}


def connect(device: Device, **options: object) -> Transport:
    """Open a transport to ``device``. ``options`` go to the transport (e.g. trust_new_host for ssh)."""
    if device.transport == "local":
        from kzbuild.devices.local import LocalTransport

        Path(device.root).mkdir(parents=True, exist_ok=True)
        return LocalTransport(device.root)
    if device.transport == "adb":
        from kzbuild.devices.adb import AdbTransport  # written by the adb work

        return AdbTransport(device, **options)  # type: ignore[arg-type]
    from kzbuild.devices.ssh import SshTransport  # written by the ssh work

    return SshTransport(device, **options)  # type: ignore[arg-type]
