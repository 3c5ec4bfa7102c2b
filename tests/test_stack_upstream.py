"""The patch stack against real llama.cpp trees (PyPI sdists of 0.3.21, 0.3.24, 0.3.36).

Patches are made with kzbuild from the real tree at f53577432 (0.3.21):
- fit-unaccounted-underflow: the size_t underflow fix of common_memory_breakdown_print
  (facts sheet 2.2), written as upstream's PR #22424 wrote it. Upstream has it from 63d93d173,
  so it must be `upstreamed` at af6528e6d (0.3.24) and 0c1e57098 (0.3.36).
- device-memory-note: edits the call to ggml_backend_dev_memory in
  common_get_device_memory_data, a line upstream rewrote before 0.3.24: `conflict` at both.
- nd-comment: edits a line two lines below one upstream changed before 0.3.24 (LOG_INF ->
  LOG_TRC), so a 3-way merge resolves it there (`3way`); by 0.3.36 upstream rewrote the lines
  right above it, and `git merge-file` on the three versions conflicts (`conflict`).

The sdists are cached in the persistent test cache, so a machine downloads them once.
"""

from __future__ import annotations

import json
import shutil

import pytest

from kzbuild.cli import main
from kzbuild.source import recipes
from tests.conftest import (
    PIN_0_3_21,
    PIN_0_3_24,
    PIN_0_3_36,
    CliResult,
    Project,
    persistent_test_cache,
)
from tests.fixtures_stack import flat, make_real_patches, real_recipe_yaml

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Project:
    """A project whose three patches were made from the real tree at f53577432."""
    root = tmp_path_factory.mktemp("real")
    project = Project(root=root / "project", cache=persistent_test_cache(), work=root / "work")
    for folder in ("recipes", "patches"):
        (project.root / folder).mkdir(parents=True)
    project.write("patches/series", "")
    project.write("recipes/real.yaml", real_recipe_yaml(PIN_0_3_21, "0.3.21"))
    make_real_patches(project.settings, recipes.load_recipe(project.root, "real"))
    return project


@pytest.fixture
def kzr(real: Project, capsys: pytest.CaptureFixture[str]):
    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main(
            [
                "--project",
                str(real.root),
                "--cache-dir",
                str(real.cache),
                "--work-dir",
                str(real.work),
                *args,
            ]
        )
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def verdicts(kzr, *args: str) -> dict[str, dict]:
    result = kzr("patches", "check", "real", *args, "--json")
    return {p["patch"]: p for p in json.loads(result.out)["patches"]}


def test_patches_are_well_formed(real, kzr):
    assert kzr("patches", "lint", "--recipe", "real").code == 0
    text = (real.root / "patches" / "fit-unaccounted-underflow.patch").read_text()
    assert "-        const size_t unaccounted = total - self - free;" in text
    assert "index " in text and len(text.split("index ")[1].split("..")[0]) == 40


def test_all_clean_at_0_3_21(kzr):
    assert {n: p["verdict"] for n, p in verdicts(kzr).items()} == {
        "fit-unaccounted-underflow.patch": "clean",
        "device-memory-note.patch": "clean",
        "nd-comment.patch": "clean",
    }


def test_against_0_3_24(real, kzr):
    # A fresh scratch repo: the blobs the later patches were made against must be recreated.
    shutil.rmtree(real.work / "scratch", ignore_errors=True)
    result = verdicts(kzr, "--against", "pypi:llama-cpp-python==0.3.24")
    fix = result["fit-unaccounted-underflow.patch"]
    assert fix["verdict"] == "upstreamed"
    assert fix["proof"]["kind"] == "reverse-apply"
    assert fix["proof"]["detail"] == f"reverse-applies cleanly on {PIN_0_3_24[:12]}"
    conflict = result["device-memory-note.patch"]
    assert conflict["verdict"] == "conflict" and conflict["files"] == ["common/fit.cpp"]
    assert len(conflict["hunks"]) == 1 and conflict["hunks"][0].startswith(
        "common/fit.cpp @@ -111,7 +111,7 @@"
    )
    drift = result["nd-comment.patch"]
    assert drift["verdict"] == "3way" and drift["files"] == ["common/fit.cpp"]
    assert verdicts(kzr, "--against", PIN_0_3_24) == result  # the same commit by sha


def test_against_0_3_36(kzr):
    result = verdicts(kzr, "--against", "pypi:llama-cpp-python==0.3.36")
    fix = result["fit-unaccounted-underflow.patch"]
    assert fix["verdict"] == "upstreamed"
    assert fix["proof"]["kind"] == "reverse-apply"
    # Upstream added code right after the fixed line by 0.3.36: only the changed lines still match.
    assert "context reduced to 0 line(s)" in fix["proof"]["detail"]
    assert result["device-memory-note.patch"]["verdict"] == "conflict"
    assert result["nd-comment.patch"]["verdict"] == "conflict"
    table = kzr("patches", "check", "real", "--against", PIN_0_3_36)
    assert table.code == 5 and "upstreamed" in table.out and "reverse-apply" in flat(table.out)


def test_bisect_over_sdists_says_history_is_missing(kzr):
    result = kzr("bump", "real", "--to", "pypi:llama-cpp-python==0.3.24", "--bisect")
    assert result.code == 5
    out = flat(result.out)
    assert "history missing: no git source to deepen from" in out
    assert "bisect device-memory-note.patch: history missing:" in out
    assert "bisect needs a git source with history" in out


def test_sync_skips_the_fix_at_0_3_24_and_bump_writes_0_3_36(real, kzr):
    patches = real.root / "patches"
    shutil.copy(patches / "fit-unaccounted-underflow.patch", patches / "fit-only-underflow.patch")
    real.write("patches/fit-only.series", "fit-only-underflow.patch\n")
    real.write(
        "recipes/real24.yaml", real_recipe_yaml(PIN_0_3_24, "0.3.24", "patches/fit-only.series")
    )
    synced = kzr("sync", "real24")
    assert synced.code == 0, synced.err
    assert (
        "skipped fit-only-underflow.patch: already upstream (reverse-apply: reverse-applies "
        "cleanly on af6528e6df5d)" in flat(synced.out)
    )
    lock = json.loads((real.root / "recipes" / "real24.lock.json").read_text())
    assert lock["patches"] == [
        {
            "file": "fit-only-underflow.patch",
            "sha256": lock["patches"][0]["sha256"],
            "commit": None,
            "upstreamed": f"reverse-apply: reverse-applies cleanly on {PIN_0_3_24[:12]}",
        },
    ]

    bumped = kzr("bump", "real24", "--to", "pypi:llama-cpp-python==0.3.36", "--write")
    assert bumped.code == 0, bumped.err
    assert "dropped fit-only-underflow.patch (upstreamed)" in flat(bumped.out)
    assert (real.root / "recipes" / "real24.yaml").read_text() == real_recipe_yaml(
        PIN_0_3_36, "0.3.36", "patches/fit-only.series"
    )
    assert (
        json.loads((real.root / "recipes" / "real24.lock.json").read_text())["upstream"]["commit"]
        == PIN_0_3_36
    )
