"""Where kzbuild keeps things: defaults < environment < flags."""

import pytest

from kzbuild.adapters.settings import Settings
from kzbuild.errors import ConfigError


def test_defaults_follow_the_project_and_xdg(tmp_path):
    (tmp_path / "recipes").mkdir()
    nested = tmp_path / "recipes" / "deep"
    nested.mkdir()
    s = Settings.resolve({"XDG_CACHE_HOME": str(tmp_path / "xdg")}, cwd=nested)
    assert s.project == tmp_path
    assert s.cache == tmp_path / "xdg" / "kzbuild"
    assert s.work == tmp_path / ".kz"
    assert s.results == tmp_path / "results"
    assert s.mirror == s.cache / "upstream.git"
    assert s.worktree("archive/old") == tmp_path / ".kz" / "src" / "archive--old"


def test_environment_overrides_defaults_and_flags_override_environment(tmp_path):
    (tmp_path / "recipes").mkdir()
    env = {
        "KZ_CACHE_DIR": str(tmp_path / "env-cache"),
        "KZ_WORK_DIR": str(tmp_path / "env-work"),
        "KZ_RESULTS_DIR": str(tmp_path / "env-results"),
    }
    s = Settings.resolve(env, cwd=tmp_path)
    assert (s.cache, s.work, s.results) == (
        tmp_path / "env-cache",
        tmp_path / "env-work",
        tmp_path / "env-results",
    )
    s = Settings.resolve(
        env, cwd=tmp_path, cache=tmp_path / "c", work=tmp_path / "w", results=tmp_path / "r"
    )
    assert (s.cache, s.work, s.results) == (tmp_path / "c", tmp_path / "w", tmp_path / "r")


def test_outside_a_project_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        Settings.resolve({}, cwd=tmp_path)
    assert "no kzbuild project found" in info.value.message and "--project" in (
        info.value.hint or ""
    )
