"""Real upstream trees synced by kzbuild with the stack, for the tests of the patches themselves.

The trees come from the PyPI sdists into the persistent test cache
(tests/fixtures_build.real_project),
so the first run on a machine downloads each sdist once and later runs sync in seconds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kzbuild.source.recipes import load_recipe
from kzbuild.source.sync import sync
from tests.conftest import Project
from tests.fixtures_build import real_project


def private_project(tmp_path: Path) -> Project:
    """real_project with a work dir of its own. The shared work dir's worktrees are re-synced by
    other test sessions, and kzbuild's build does not hold the worktree while ninja runs, so a
    build there can compile a mix of two stacks (and cache it in ccache under the wrong key).
    The object cache and ccache stay shared: ccache's base dir is the work dir, so they still
    hit."""
    return dataclasses.replace(real_project(tmp_path), work=tmp_path / "work")


def synced_tree(tmp_path: Path, recipe_name: str) -> Path:
    """Sync the repo's recipe ``recipe_name`` (stack and overlays applied); return its tree."""
    project = private_project(tmp_path)
    return sync(project.settings, load_recipe(project.root, recipe_name)).worktree


@pytest.fixture(scope="session")
def pin_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """demo-host: the pin 0c1e57098 with patches/series and the kernel overlays."""
    return synced_tree(tmp_path_factory.mktemp("pin"), "demo-host")


@pytest.fixture(scope="session")
def archive_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """archive/host-f53577432: f53577432 with the unaccounted-underflow backport."""
    return synced_tree(tmp_path_factory.mktemp("archive"), "archive/host-f53577432")
