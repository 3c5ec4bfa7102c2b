"""Real upstream trees synced by kzbuild with the stack, for the tests of the patches themselves.

The trees come from the PyPI sdists into the persistent test cache (tests/fixtures_build.real_project),
so the first run on a machine downloads each sdist once and later runs sync in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kzbuild.recipes import load_recipe
from kzbuild.sync import sync
from tests.fixtures_build import real_project


def synced_tree(tmp_path: Path, recipe_name: str) -> Path:
    """Sync the repo's recipe ``recipe_name`` (stack and overlays applied); return its tree."""
    project = real_project(tmp_path)
    return sync(project.settings, load_recipe(project.root, recipe_name)).worktree


@pytest.fixture(scope="session")
def pin_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-host: the pin 0c1e57098 with patches/series and the kernel overlays."""
    return synced_tree(tmp_path_factory.mktemp("pin"), "demo-host")


@pytest.fixture(scope="session")
def archive_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """archive/host-f53577432: f53577432 with the unaccounted-underflow backport."""
    return synced_tree(tmp_path_factory.mktemp("archive"), "archive/host-f53577432")
