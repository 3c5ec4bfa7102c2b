"""Sync the team's real recipe against real upstream llama.cpp from the PyPI sdist mirror (slow
tier)."""

from __future__ import annotations

import json

import pytest

from kzbuild.cli import main
from tests.conftest import PIN_0_3_36, REPO_ROOT, git
from tests.fixtures_build import real_project

pytestmark = pytest.mark.slow


@pytest.fixture
def fresh_project(tmp_path):
    """A first sync's situation: a new object cache and work dir (sdists still downloaded once per
    machine)."""
    project = real_project(tmp_path, fresh_cache=True)
    return project.root, project.cache, project.work


def test_sync_pad3_v79_from_pypi_sdist(fresh_project, capsys):
    root, cache, work = fresh_project
    committed_lock = (REPO_ROOT / "recipes/pad3-v79.lock.json").read_bytes()
    args = ["--project", str(root), "--cache-dir", str(cache), "--work-dir", str(work)]
    assert main([*args, "sync", "pad3-v79"]) == 0
    out = capsys.readouterr()
    assert "pypi-sdist:llama-cpp-python==0.3.36" in out.out
    worktree = work / "src" / "pad3-v79"
    assert git(worktree, "rev-parse", "refs/kz/base") == PIN_0_3_36
    assert git(worktree, "status", "--porcelain") == ""
    assert (
        git(worktree, "log", "-1", "--format=%s", PIN_0_3_36)
        == "webgpu: fix SSM_SCAN binding aliasing (#29750)"
    )
    lock = json.loads((root / "recipes/pad3-v79.lock.json").read_text())
    assert lock["upstream"]["commit"] == PIN_0_3_36
    assert lock["upstream"]["fetched_from"] == "pypi-sdist:llama-cpp-python==0.3.36"
    # The committed lock is what this machine resolves too: same tree, same patched commits.
    assert (root / "recipes/pad3-v79.lock.json").read_bytes() == committed_lock
    # A second sync finds everything in place and downloads nothing.
    assert main([*args, "sync", "pad3-v79"]) == 0
    assert "up to date" in capsys.readouterr().out
