"""The adb test device fixtures (tests/adbdevice) and an AdbTransport connected to it."""

from __future__ import annotations

import pytest

from kzbuild.device.adb import AdbTransport
from tests.adbdevice import AdbTestDevice

DEVICE_ROOT = "/data/local/tmp/kz-engine"


@pytest.fixture
def transport(adb_device: AdbTestDevice) -> AdbTransport:
    return AdbTransport(adb_device.device(root=DEVICE_ROOT), connect_timeout=5)
