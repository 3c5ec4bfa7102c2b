"""Named devices (``recipes/devices.yaml``), ad-hoc device specs, and opening a transport.

Ad-hoc specs on the command line: ``adb:SERIAL[:ROOT]``, ``ssh://user@host:port/ROOT``,
``local:/path``. A name is looked up in the devices file; ``local`` is built in (a staging
dir under the work dir).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from urllib.parse import unquote

from kzbuild.adapters import yamlconf
from kzbuild.adapters.settings import Settings
from kzbuild.device.base import Transport, check_env_name
from kzbuild.errors import ConfigError
from kzbuild.model.device import DEFAULT_ROOT, Device

DEVICES_FILE = "devices.yaml"  # in recipes/
DEVICE_KEYS = (
    "description",
    "transport",
    "serial",
    "server",
    "host",
    "port",
    "user",
    "key",
    "root",
    "env",
    "runner",
)
DEFAULT_ENV = (("LD_LIBRARY_PATH", "{current}/lib"), ("ADSP_LIBRARY_PATH", "{current}/lib"))
ADB_SERIAL_TEXT = r"[^\s:/]+(?::\d+)?"  # a USB serial, or host:port for adb over TCP
ADB_SERIAL = re.compile(f"^{ADB_SERIAL_TEXT}$")
ADB_SPEC = re.compile(f"^adb:(?P<serial>{ADB_SERIAL_TEXT})(?::(?P<root>/.*))?$")
# ssh://[user@]host[:port][/root]; the parts are checked one by one so the error names the bad one
SSH_SPEC = re.compile(
    r"^ssh://(?:(?P<user>[^@/]*)@)?(?P<host>\[[^\]/]*\]|[^:/\[\]]*)(?::(?P<port>[^/]*))?(?P<root>/.*)?$"
)
SSH_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")
HOST_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def devices_file(settings: Settings) -> Path:
    return settings.recipes / DEVICES_FILE


def load_devices(settings: Settings) -> dict[str, Device]:
    return load_registry(settings)[0]


def load_registry(settings: Settings) -> tuple[dict[str, Device], dict[str, tuple[str, ...]]]:
    """The named devices (with ``local``) and the pools: name -> its member devices' names."""
    path = devices_file(settings)
    devices = {"local": local_device(settings)}
    if not path.is_file():
        return devices, {}
    doc = yamlconf.load(path)
    doc.check_keys(("devices", "pools"), required=("devices",), context="devices file")
    for name, entry in doc.get_mapping("devices").items():
        if not isinstance(entry, yamlconf.Mapping):
            raise doc.get_mapping("devices").error(name, "a device is a mapping")
        devices[name] = parse_device(name, entry)
    pools: dict[str, tuple[str, ...]] = {}
    section = doc.get_mapping("pools")
    for name in section:
        members = section.get_str_list(name)
        if name in devices:
            raise section.error(name, f"pool '{name}' has the name of a device")
        unknown = [m for m in members if m not in devices]
        if unknown or not members or len(set(members)) != len(members):
            problem = (
                f"unknown device(s) {', '.join(unknown)}"
                if unknown
                else "give distinct device names"
            )
            raise section.error(
                name,
                f"pool '{name}': {problem}",
                hint=f"its members are names under devices: ({', '.join(sorted(devices))})",
            )
        pools[name] = tuple(members)
    return devices, pools


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
        if not yamlconf.is_scalar_text(value):
            raise env_section.error(key, "must be a string")
        env.append((key, str(value)))
    runner = entry.get_str_list("runner")
    port = entry.get("port", 22)
    root = entry.get_str("root", DEFAULT_ROOT) or DEFAULT_ROOT
    for key, problem in (
        ("port", port_problem(port)),
        ("host", ssh_host_problem(entry.get_str("host") or "") if transport == "ssh" else None),
        ("user", ssh_user_problem(entry.get_str("user") or "") if "user" in entry else None),
        ("root", root_problem(root)),
        (
            "serial",
            adb_serial_problem(entry.get_str("serial") or "") if transport == "adb" else None,
        ),
        (
            "server",
            adb_server_problem(entry.get_str("server") or "") if "server" in entry else None,
        ),
    ):
        if problem is not None:
            raise entry.error(key, f"device {name}: {problem}")
    return Device(
        name=name,
        transport=transport,  # type: ignore[arg-type]
        root=root,
        serial=entry.get_str("serial"),
        server=entry.get_str("server") if transport == "adb" else None,
        host=entry.get_str("host"),
        port=int(
            port
        ),  # port_problem() admitted an int or a string of digits ("2222" quoted in YAML)
        user=entry.get_str("user"),
        key=entry.get_path("key"),
        env=tuple(env) if "env" in entry else DEFAULT_ENV,
        runner_prefix=runner,
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
            raise ConfigError(
                f"bad adb device spec '{spec}'", hint="use adb:SERIAL or adb:SERIAL:/root/path"
            )
        root = match["root"] or DEFAULT_ROOT
        _check_spec_part(spec, "root", root_problem(root))
        return Device(
            name=spec, transport="adb", serial=match["serial"], root=root, env=DEFAULT_ENV
        )
    if spec.startswith("ssh://"):
        return _parse_ssh_spec(spec)
    if spec.startswith("local:"):
        root = spec.removeprefix("local:")
        if not root.startswith("/"):
            raise ConfigError(f"bad local device spec '{spec}'", hint="use local:/absolute/path")
        _check_spec_part(spec, "root", root_problem(root))
        return Device(name=spec, transport="local", root=root, env=DEFAULT_ENV)
    return None


def _parse_ssh_spec(spec: str) -> Device:
    match = SSH_SPEC.match(spec)
    if not match:
        raise ConfigError(f"bad ssh device spec {spec!r}", hint=SSH_SPEC_HINT)
    user, host, port_text, root_text = match["user"], match["host"], match["port"], match["root"]
    if user is not None:
        _check_spec_part(spec, "user", ssh_user_problem(user))
    if host.startswith("["):  # an IPv6 address is written in brackets in a URL, because of the port
        host = host[1:-1]
        _check_spec_part(
            spec, "host", None if _is_ipv6(host) else f"[{host}] is not an IPv6 address"
        )
    else:
        _check_spec_part(spec, "host", ssh_host_problem(host))
    port = 22
    if port_text is not None:
        _check_spec_part(spec, "port", port_problem(port_text))
        port = int(port_text)
    root = DEFAULT_ROOT
    if root_text not in (None, "", "/"):
        try:
            root = unquote(root_text, errors="strict")
        except UnicodeDecodeError:
            _check_spec_part(spec, "root", f"{root_text!r} has percent-escapes that are not UTF-8")
        _check_spec_part(spec, "root", root_problem(root))
    return Device(
        name=spec, transport="ssh", host=host, port=port, user=user, root=root, env=DEFAULT_ENV
    )


SSH_SPEC_HINT = (
    "use ssh://user@host:port/root/path (port 1-65535, an IPv6 host in brackets: "
    "ssh://user@[::1]:22/root)"
)


def _check_spec_part(spec: str, part: str, problem: str | None) -> None:
    if problem is not None:
        raise ConfigError(
            f"bad {part} in device spec {spec!r}: {problem}",
            hint=SSH_SPEC_HINT if spec.startswith("ssh:") else None,
        )


def ssh_user_problem(user: str) -> str | None:
    """What is wrong with an ssh user name, or None (a password in the URL is refused: keys
    only)."""
    if ":" in user:
        return (
            "a password does not belong in the spec; kzbuild uses keys or the agent, never "
            "passwords"
        )
    if not SSH_USER.match(user):
        return f"{user!r} is not a user name (letters, digits, '.', '_', '-')"
    return None


def ssh_host_problem(host: str) -> str | None:
    """What is wrong with a host name or address, or None."""
    if not host:
        return "the host is empty"
    if _is_ipv6(host):
        return None
    labels = host.removesuffix(".").split(".")
    if len(host) > 253 or not all(HOST_LABEL.match(label) for label in labels):
        return f"{host!r} is not a host name or IP address"
    return None


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def adb_serial_problem(serial: str) -> str | None:
    if not ADB_SERIAL.match(serial):
        return (
            f"{serial!r} is not an adb serial (no spaces; ':' only before a port, as in host:5555)"
        )
    return None


def adb_server_problem(server: str) -> str | None:
    """What is wrong with an adb server address (HOST:PORT, as ``adb -H HOST -P PORT`` takes), or
    None."""
    host, colon, port = server.rpartition(":")
    if not colon or not host:
        return f"{server!r} is not HOST:PORT of an adb server"
    return ssh_host_problem(host.strip("[]")) or port_problem(port)


def port_problem(port: object) -> str | None:
    """What is wrong with a TCP port (an int, or the digits of one), or None."""
    if isinstance(port, str) and port.isascii() and port.isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return f"{str(port)[:20]!r} is not a port number (1 to 65535)"
    return None


def root_problem(root: str) -> str | None:
    """What is wrong with a device root, or None: an absolute path without control characters."""
    if not root.startswith(
        "/"
    ):  # the store's paths would depend on the directory a command starts in
        return f"{root!r} is not an absolute path"
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in root):
        return f"{root!r} holds control characters"
    return None


def resolve_devices(
    settings: Settings, spec: str | None, default: str | None = None
) -> list[Device]:
    """A pool's members (a pool is named like a device), else the one device ``spec`` names."""
    wanted = spec or default or "local"
    if parse_device_spec(wanted) is None:
        devices, pools = load_registry(settings)
        if wanted in pools:
            return [devices[name] for name in pools[wanted]]
    return [resolve_device(settings, spec, default)]


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
            hint=f"known devices: {', '.join(sorted(devices))}; or use adb:SERIAL, "
            "ssh://user@host:port/ROOT, local:/path",
        )
    return devices[wanted]


def device_env(device: Device, current: str) -> dict[str, str]:
    """The device's default env with ``{current}`` expanded to the current release dir."""
    return {key: value.replace("{current}", current) for key, value in device.env}


def connect(device: Device, **options: object) -> Transport:
    """Open a transport to ``device``. ``options`` go to the transport (e.g. trust_new_host for
    ssh)."""
    if device.transport == "local":
        from kzbuild.device.local import LocalTransport

        Path(device.root).mkdir(parents=True, exist_ok=True)
        return LocalTransport(device.root)
    if device.transport == "adb":
        from kzbuild.device.adb import AdbTransport  # written by the adb work

        return AdbTransport(device, **options)  # type: ignore[arg-type]
    from kzbuild.device.ssh import SshTransport  # written by the ssh work

    return SshTransport(device, **options)  # type: ignore[arg-type]
