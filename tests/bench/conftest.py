"""Fixtures for the run, bench and results tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.benchkit import DeviceRoot, make_device_root

MANIFEST = {"build_id": "b0000000000000001", "recipe": "demo-host", "lock_sha256": "0" * 64}


@pytest.fixture
def device_root(tmp_path: Path) -> DeviceRoot:
    return make_device_root(tmp_path / "device", manifest=MANIFEST)
