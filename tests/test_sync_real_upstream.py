"""Sync the team's real recipe against real upstream llama.cpp from the PyPI sdist mirror (slow tier)."""

from __future__ import annotations

import json
import shutil

import pytest

from kzbuild.cli import main
from tests.conftest import PIN_0_3_36, REPO_ROOT, git, persistent_test_cache

pytestmark = pytest.mark.slow


@pytest.fixture
def real_project(tmp_path):
    """A copy of this repo's recipes, patches and kernels, a fresh object cache, and the cached sdists."""
    root = tmp_path / "project"
    for folder in ("recipes", "patches", "kernels"):
        shutil.copytree(REPO_ROOT / folder, root / folder)
    cache = tmp_path / "cache"
    cache.mkdir()
    sdists = persistent_test_cache() / "sdists"
    sdists.mkdir(exist_ok=True)
    (cache / "sdists").symlink_to(sdists)  # downloaded once per machine, fetched from every run
    return root, cache, tmp_path / "work"


def test_sync_pad3_v79_from_pypi_sdist(real_project, capsys):
    root, cache, work = real_project
    committed_lock = (root / "recipes/pad3-v79.lock.json").read_bytes()
    (root / "recipes/pad3-v79.lock.json").unlink()
    args = ["--project", str(root), "--cache-dir", str(cache), "--work-dir", str(work)]
    assert main([*args, "sync", "pad3-v79"]) == 0
    out = capsys.readouterr()
    assert "pypi-sdist:llama-cpp-python==0.3.36" in out.out
    worktree = work / "src" / "pad3-v79"
    assert git(worktree, "rev-parse", "refs/kz/base") == PIN_0_3_36
    assert git(worktree, "status", "--porcelain") == ""
    assert git(worktree, "log", "-1", "--format=%s", PIN_0_3_36) == "webgpu: fix SSM_SCAN binding aliasing (#29750)"
    lock = json.loads((root / "recipes/pad3-v79.lock.json").read_text())
    assert lock["upstream"]["commit"] == PIN_0_3_36
    assert lock["upstream"]["fetched_from"] == "pypi-sdist:llama-cpp-python==0.3.36"
    # The committed lock is what this machine resolves too: same tree, same patched commits.
    assert (root / "recipes/pad3-v79.lock.json").read_bytes() == committed_lock
    # A second sync finds everything in place and downloads nothing.
    assert main([*args, "sync", "pad3-v79"]) == 0
    assert "up to date" in capsys.readouterr().out
