"""pytest fixtures: a private adb server (one per session) and test devices connected to it.

tests/conftest.py registers this module as a plugin (``pytest_plugins``), so every test can
name them as parameters and the session's adb server starts once; never import them.

See the package docstring (``tests/adbdevice/__init__.py``) for what a test gets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.adbdevice.device import AdbTestDevice, Mode
from tests.adbdevice.server import PrivateAdbServer

MakeDevice = Callable[..., AdbTestDevice]


@pytest.fixture(scope="session")
def adb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateAdbServer]:
    server = PrivateAdbServer(tmp_path_factory.mktemp("adb-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def adb_env(adb_server: PrivateAdbServer, monkeypatch: pytest.MonkeyPatch) -> PrivateAdbServer:
    """Sets ANDROID_ADB_SERVER_PORT for the test so every adb client (kzbuild's too) talks to
    the private server, never to (or starting) one on the default port."""
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(adb_server.port))
    return adb_server


@pytest.fixture
def make_adb_device(
    adb_env: PrivateAdbServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MakeDevice]:
    """``make_adb_device(mode="device"|"unauthorized"|"offline", props=None, selinux=True,
    symlinks=True)`` -> AdbTestDevice (``selinux``: its shell may not hard-link, as on Android;
    ``symlinks=False``: nor make symlinks).

    With ``adb_env`` in force. Devices are disconnected from the server and stopped afterwards.
    """
    made: list[AdbTestDevice] = []

    def make(
        mode: Mode = "device",
        props: Mapping[str, str] | None = None,
        *,
        selinux: bool = True,
        symlinks: bool = True,
    ) -> AdbTestDevice:
        device = AdbTestDevice(
            tmp_path_factory.mktemp("adbdevice"),
            mode=mode,
            props=props,
            selinux=selinux,
            symlinks=symlinks,
        )
        made.append(device)
        return device

    yield make
    for device in made:
        adb_env.adb("disconnect", device.serial)
        device.stop()


@pytest.fixture
def adb_device(make_adb_device: MakeDevice) -> AdbTestDevice:
    """An online test device (not yet ``adb connect``-ed: AdbTransport connects it)."""
    return make_adb_device()


@dataclass(frozen=True)
class AdbPool:
    """Two online test devices: ``first`` on the session's adb server, ``second`` on ``server``,
    another adb server (as a tablet on another machine, reached with ``adb -H HOST -P PORT``)."""

    first: AdbTestDevice
    second: AdbTestDevice
    server: PrivateAdbServer

    def devices_yaml(self, root: str) -> str:
        """recipes/devices.yaml naming them pad-a and pad-b, in the pool ``pads``."""
        return (
            "devices:\n"
            f"  pad-a: {{transport: adb, serial: '{self.first.serial}', root: {root}}}\n"
            f"  pad-b: {{transport: adb, serial: '{self.second.serial}', server: "
            f"'127.0.0.1:{self.server.port}', root: {root}}}\n"
            "pools:\n  pads: [pad-a, pad-b]\n"
        )

    def put(self, root: str, relpath: str, data: bytes) -> None:
        """The same file on both devices, under ``root``."""
        for device in (self.first, self.second):
            path = device.host_path(f"{root}/{relpath}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


@pytest.fixture
def adb_pool(make_adb_device: MakeDevice, tmp_path: Path) -> Iterator[AdbPool]:
    other = PrivateAdbServer(tmp_path / "adb-server-2")
    other.start()
    pool = AdbPool(make_adb_device(), make_adb_device(), other)
    try:
        yield pool
    finally:
        other.adb("disconnect", pool.second.serial)
        other.stop()
