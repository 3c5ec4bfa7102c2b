"""Fixtures for deploy tests: artifacts with real ELF files, a real sshd, a cutting relay, the adb test device."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adbdevice.fixtures import adb_device, adb_env, adb_server, make_adb_device  # noqa: F401 (fixtures)
from tests.fixtures_deploy import ArtifactMaker
from tests.fixtures_ssh import relay, ssh_home, sshd  # noqa: F401 (fixtures used by the tests here)


@pytest.fixture(scope="session")
def compiled_parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("elf-parts")


@pytest.fixture
def artifacts(tmp_path: Path, compiled_parts: Path) -> ArtifactMaker:
    return ArtifactMaker(tmp_path / "artifacts", compiled_parts)
