"""The stack's files agree with each other: every patch is in a series, names a test that exists,
and is exported in the agreed normal form; the production and demo recipes carry the same stack."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kzbuild.recipes import list_recipes, load_recipe
from kzbuild.stack import read_series
from tests.conftest import REPO_ROOT

PATCHES = sorted((REPO_ROOT / "patches").glob("*.patch"))
UPSTREAM_STATUS = re.compile(r"^Upstream-Status: (Pending|Submitted \S+|Backport \S+|Inappropriate .+|Merged [0-9a-f]{40})$", re.M)


def trailer(text: str, key: str) -> list[str]:
    return re.findall(rf"^{key}: (.+)$", text.split("\n---\n", 1)[0].split("\ndiff --git ", 1)[0], re.M)


def test_there_are_patches():
    assert len(PATCHES) >= 3


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_patch_names_a_test_that_exists(patch: Path):
    tests = trailer(patch.read_text(), "Kz-Test")
    assert len(tests) == 1, f"{patch.name}: needs exactly one Kz-Test trailer"
    file, _, name = tests[0].partition("::")
    assert (REPO_ROOT / file).is_file(), f"{patch.name}: Kz-Test file {file} does not exist"
    assert re.search(rf"^def {re.escape(name)}\(", (REPO_ROOT / file).read_text(), re.M), f"{patch.name}: no test {name} in {file}"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_patch_is_in_the_agreed_normal_form(patch: Path):
    text = patch.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
    assert "\nFrom: kzbuild team <team@kzbuild.invalid>\n" in text
    assert UPSTREAM_STATUS.search(text), f"{patch.name}: no valid Upstream-Status trailer"
    assert re.findall(r"^index [0-9a-f]{40}\.\.[0-9a-f]{40}", text, re.M), f"{patch.name}: needs full index lines"
    assert "\n-- \n" not in text and " files changed" not in text  # no signature, no diffstat
    assert not re.match(r"\d{4}-", patch.name)
    if "Backport" in trailer(text, "Upstream-Status")[0]:
        assert all(re.fullmatch(r"[0-9a-f]{40}", sha) for sha in trailer(text, "Drop-When"))


def test_every_patch_is_listed_by_a_recipe():
    listed = set()
    for name in list_recipes(REPO_ROOT / "recipes"):
        listed |= {entry.path for entry in read_series(load_recipe(REPO_ROOT, name).series).entries}
    assert {p.resolve() for p in PATCHES} == listed


def test_production_and_demo_recipes_carry_the_same_stack():
    pad3, demo = load_recipe(REPO_ROOT, "pad3-v79"), load_recipe(REPO_ROOT, "demo-host")
    assert pad3.upstream.commit == demo.upstream.commit
    assert pad3.series == demo.series
    assert pad3.overlays == demo.overlays and pad3.overlays


def test_the_backport_is_only_in_the_archive_series():
    backport = "common-signed-unaccounted-memory-backport-22424.patch"
    assert backport not in read_series(REPO_ROOT / "patches" / "series").names()
    archive = load_recipe(REPO_ROOT, "archive/host-f53577432")
    assert read_series(archive.series).names() == [backport]
    assert archive.upstream.commit.startswith("f53577432")
