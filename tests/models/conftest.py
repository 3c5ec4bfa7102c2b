"""Tiny GGUF models shared by the model tests (written once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kzbuild.measure.tinymodel import ARCHS, FTYPES, write_tiny_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Every (arch, ftype) tiny model with the default seed."""
    folder = tmp_path_factory.mktemp("tiny-models")
    return {
        (arch, ftype): write_tiny_model(folder / f"tiny-{arch}-{ftype}.gguf", arch, ftype)
        for arch in ARCHS
        for ftype in FTYPES
    }
