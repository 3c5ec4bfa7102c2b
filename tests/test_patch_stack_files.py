"""The stack's files agree with each other: every series lints clean, every patch names a test
that exists and is exported in the agreed form, and the production and demo recipes carry the
same stack. (`kzbuild patches lint` checks trailers and series; whether Kz-Test names a real
test is checked here.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kzbuild.model.patch import KZ_TEST
from kzbuild.source.recipes import load_recipe
from kzbuild.source.stack.patchfile import lint_series, read_patch
from kzbuild.source.stack.series import read_series
from tests.conftest import REPO_ROOT

PATCHES = sorted((REPO_ROOT / "patches").glob("*.patch"))
SERIES = sorted((REPO_ROOT / "patches").glob("*series"))


def test_there_are_patches_and_series():
    assert len(PATCHES) >= 3 and len(SERIES) >= 2


@pytest.mark.parametrize("series", SERIES, ids=lambda p: p.name)
def test_series_lints_clean(series: Path):
    patches, problems = lint_series(series)
    assert patches and problems == []


@pytest.mark.parametrize("patch_path", PATCHES, ids=lambda p: p.name)
def test_patch_names_a_test_that_exists(patch_path: Path):
    file, _, name = (read_patch(patch_path).trailer(KZ_TEST) or "").partition("::")
    assert (REPO_ROOT / file).is_file(), f"{patch_path.name}: Kz-Test file {file!r} does not exist"
    assert re.search(rf"^def {re.escape(name)}\(", (REPO_ROOT / file).read_text(), re.M), (
        f"{patch_path.name}: no test {name} in {file}"
    )


@pytest.mark.parametrize("patch_path", PATCHES, ids=lambda p: p.name)
def test_patch_is_a_team_patch_with_full_index(patch_path: Path):
    patch = read_patch(patch_path)
    assert patch.author == "kzbuild team <team@kzbuild.invalid>"
    assert patch.files and all(change.full_index for change in patch.files)
    assert patch_path.read_text().startswith("From 0000000000000000000000000000000000000000 ")


def test_production_and_demo_recipes_carry_the_same_stack():
    pad3, demo = load_recipe(REPO_ROOT, "pad3-v79"), load_recipe(REPO_ROOT, "demo-host")
    assert pad3.upstream.commit == demo.upstream.commit
    assert pad3.series == demo.series
    assert pad3.overlays == demo.overlays


def test_the_backport_is_carried_for_old_pins_and_skipped_at_the_pin():
    backport = "common-signed-unaccounted-memory-backport-22424.patch"
    assert backport in read_series(REPO_ROOT / "patches" / "series").names()
    pad3 = json.loads((REPO_ROOT / "recipes" / "pad3-v79.lock.json").read_text())
    skipped = {p["file"]: p for p in pad3["patches"]}[backport]
    assert skipped["commit"] is None and skipped["upstreamed"].startswith("reverse-apply")
    archive = load_recipe(REPO_ROOT, "archive/host-f53577432")
    assert read_series(archive.series).names() == [backport]
    assert archive.upstream.commit.startswith("f53577432")
    assert (
        read_patch(REPO_ROOT / "patches" / backport).trailer("Drop-When")
        == "63d93d17336e41e4cc73a64451e5b1d2477abdb1"
    )
