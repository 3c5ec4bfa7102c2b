"""Fixtures for deploy tests: artifacts with real ELF files, a real sshd, a cutting relay, the adb
test device."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures_deploy import ArtifactMaker


@pytest.fixture(scope="session")
def compiled_parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("elf-parts")


@pytest.fixture
def artifacts(tmp_path: Path, compiled_parts: Path) -> ArtifactMaker:
    return ArtifactMaker(tmp_path / "artifacts", compiled_parts)
