"""Recipe loading: every bad input names the file, the line and the key."""

from __future__ import annotations

import pytest

from kzbuild.errors import ConfigError
from kzbuild.source.recipes import list_recipes, load_recipe

SHA = "a" * 40


def write_recipe(project, body: str) -> None:
    project.write("recipes/r.yaml", body)


def load(project):
    return load_recipe(project.root, "r")


def error_of(project, body: str) -> ConfigError:
    write_recipe(project, body)
    with pytest.raises(ConfigError) as info:
        load(project)
    return info.value


GOOD = f"""\
description: ok
upstream:
  remote: https://example.invalid/llama.cpp
  commit: {SHA}
  sources:
    - git: https://example.invalid/llama.cpp
    - pypi-sdist: llama-cpp-python==0.3.36
    - path: /srv/mirror
build:
  targets: [host]
  cmake: {{GGML_OPENCL: false, GGML_NATIVE: ON}}
device: local
"""


def test_good_recipe_loads_with_sources_in_order(project):
    write_recipe(project, GOOD)
    recipe = load(project)
    assert recipe.name == "r"
    assert recipe.upstream.commit == SHA
    assert [s.label for s in recipe.upstream.sources] == [
        "git:https://example.invalid/llama.cpp",
        "pypi-sdist:llama-cpp-python==0.3.36",
        "path:/srv/mirror",
    ]
    assert recipe.build.cmake_options == {"GGML_OPENCL": "OFF", "GGML_NATIVE": "ON"}
    assert recipe.series == project.root / "patches" / "series"
    assert recipe.lock_path.name == "r.lock.json"


def test_remote_alone_is_the_only_source(project):
    write_recipe(project, f"upstream:\n  remote: file:///srv/llama\n  commit: {SHA}\n")
    assert [s.label for s in load(project).upstream.sources] == ["git:file:///srv/llama"]


def test_malformed_yaml_names_file_and_line(project):
    err = error_of(project, f"upstream:\n  commit: {SHA}\n  sources: [git: x\n")
    assert "r.yaml:" in err.message and "invalid YAML" in err.message
    assert err.line is not None and err.line >= 3


def test_unknown_key_names_line_and_suggests(project):
    err = error_of(project, GOOD.replace("device: local", "devcie: local"))
    assert err.line == 12
    assert "devcie: unknown key" in err.message
    assert err.hint == "did you mean 'device'?"


def test_unknown_key_inside_upstream(project):
    err = error_of(project, GOOD.replace("  remote:", "  remot:"))
    assert err.line == 3 and err.key == "remot"


@pytest.mark.parametrize("bad", ["abc123", "A" * 40, "a" * 39, "master"])
def test_commit_must_be_full_sha(project, bad):
    err = error_of(project, GOOD.replace(SHA, bad))
    assert err.line == 4 and err.key == "commit"
    assert "full 40-hex" in err.message


def test_unknown_source_kind(project):
    err = error_of(project, GOOD.replace("    - path: /srv/mirror", "    - svn: /srv/mirror"))
    assert err.line == 8 and "svn: unknown key" in err.message


def test_sdist_source_needs_a_pinned_version(project):
    err = error_of(project, GOOD.replace("llama-cpp-python==0.3.36", "llama-cpp-python"))
    assert err.line == 7 and "must pin a version" in err.message


def test_missing_patch_file_names_series_line(project):
    project.series("exists.patch", "missing.patch")
    project.write("patches/exists.patch", "x")
    err = error_of(project, GOOD)
    assert err.path == project.root / "patches" / "series"
    assert err.line == 3
    assert "'missing.patch' does not exist" in err.message


def test_duplicate_series_entry(project):
    project.series("a.patch", "a.patch")
    project.write("patches/a.patch", "x")
    err = error_of(project, GOOD)
    assert err.line == 3 and "listed twice (first on line 2)" in err.message


def test_missing_series_file(project):
    err = error_of(project, GOOD + "patches: patches/other.series\n")
    assert err.line == 13 and "other.series' does not exist" in err.message


def test_overlay_source_missing(project):
    err = error_of(project, GOOD + "overlays:\n  - src: kernels/nope.h\n    dest: ggml/nope.h\n")
    assert err.line == 14 and err.key == "src" and "does not exist" in err.message


@pytest.mark.parametrize(
    "dest", ["../outside.h", "/etc/passwd", "ggml/../../x.h", ".git/hooks/pre-commit"]
)
def test_overlay_target_escaping_the_tree(project, dest):
    project.write("kernels/k.h", "// k\n")
    err = error_of(project, GOOD + f"overlays:\n  - src: kernels/k.h\n    dest: {dest}\n")
    assert err.line == 15 and err.key == "dest" and "escapes the source tree" in err.message


def test_duplicate_key(project):
    err = error_of(project, GOOD + "device: other\n")
    assert err.line == 13 and "duplicate key" in err.message


def test_unknown_recipe_lists_known_ones(project):
    write_recipe(project, GOOD)
    with pytest.raises(ConfigError) as info:
        load_recipe(project.root, "nope")
    assert "no recipe named 'nope'" in info.value.message
    assert "r" in (info.value.hint or "")


def test_list_recipes_skips_the_devices_file(project):
    write_recipe(project, GOOD)
    project.write("recipes/archive/old.yaml", GOOD)
    project.write("recipes/devices.yaml", "devices: {}\n")
    assert list_recipes(project.root / "recipes") == ["archive/old", "r"]


def test_cli_reports_config_error_with_exit_code_2(project, kz):
    write_recipe(project, GOOD.replace(SHA, "deadbeef"))
    result = kz("status", "r")
    assert result.code == 2
    assert "r.yaml:4: commit:" in result.err.replace("\n", "")


def test_project_recipes_are_valid():
    """The committed recipes load (their series, overlays and keys are valid)."""
    from tests.conftest import REPO_ROOT

    names = list_recipes(REPO_ROOT / "recipes")
    assert "pad3-v79" in names and "demo-host" in names
    for name in names:
        recipe = load_recipe(REPO_ROOT, name)
        assert len(recipe.upstream.commit) == 40
