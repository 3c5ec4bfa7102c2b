"""pytest fixtures: a private adb server (one per session) and test devices connected to it.

tests/conftest.py registers this module as a plugin (``pytest_plugins``), so every test can
name them as parameters and the session's adb server starts once; never import them.

See the package docstring (``tests/adbdevice/__init__.py``) for what a test gets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

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
    """``make_adb_device(mode="device"|"unauthorized"|"offline", props=None)`` -> AdbTestDevice.

    With ``adb_env`` in force. Devices are disconnected from the server and stopped afterwards.
    """
    made: list[AdbTestDevice] = []

    def make(mode: Mode = "device", props: Mapping[str, str] | None = None) -> AdbTestDevice:
        device = AdbTestDevice(tmp_path_factory.mktemp("adbdevice"), mode=mode, props=props)
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
