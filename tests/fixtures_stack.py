"""Fixtures for the patch-stack tests: real upstream trees synced by kzbuild with the stack.

The trees come from the PyPI sdists (the only upstream source every machine reaches) into
the persistent test cache, so the first run on a machine downloads each sdist once and later
runs sync in seconds. Each session syncs into its own temp project, a copy of the repo's
recipes, patches and kernels, so the repo's lock files are never touched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kzbuild.recipes import load_recipe
from kzbuild.settings import Settings
from kzbuild.sync import sync
from tests.conftest import REPO_ROOT, persistent_test_cache


def synced_tree(root: Path, recipe_name: str) -> Path:
    """Sync the repo's recipe ``recipe_name`` (stack and overlays applied) under ``root``; return the tree."""
    project = root / "project"
    if not project.exists():
        for folder in ("recipes", "patches", "kernels"):
            shutil.copytree(REPO_ROOT / folder, project / folder)
        for lock in (project / "recipes").rglob("*.lock.json"):
            lock.unlink()
    cache = persistent_test_cache()
    settings = Settings(project=project, cache=cache / "kz-cache", work=root / "work")
    (cache / "sdists").mkdir(exist_ok=True)
    if not settings.sdists.exists():
        settings.sdists.parent.mkdir(parents=True, exist_ok=True)
        settings.sdists.symlink_to(cache / "sdists")
    return sync(settings, load_recipe(project, recipe_name)).worktree


@pytest.fixture(scope="session")
def pin_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-host: the pin 0c1e57098 with patches/series and the kernel overlays."""
    return synced_tree(tmp_path_factory.mktemp("pin"), "demo-host")


@pytest.fixture(scope="session")
def archive_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """archive/host-f53577432: f53577432 with the unaccounted-underflow backport."""
    return synced_tree(tmp_path_factory.mktemp("archive"), "archive/host-f53577432")
