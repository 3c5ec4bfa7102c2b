"""``kzbuild roll`` on real upstream sdists, with the real host build (slow tier)."""

from __future__ import annotations

import os

import pytest

from kzbuild import roll
from kzbuild.model.roll import Outcome
from kzbuild.model.stackcheck import StepStatus, Verdict
from kzbuild.recipes import load_recipe
from tests.conftest import PIN_0_3_21, PIN_0_3_24
from tests.fixtures_trees import private_project

pytestmark = pytest.mark.slow

BACKPORT = "common-signed-unaccounted-memory-backport-22424.patch"


def test_the_archive_recipe_rolled_to_0_3_24_drops_the_backport_builds_and_says_history_is_missing(tmp_path):
    project = private_project(tmp_path)
    path = project.root / "recipes" / "archive" / "host-f53577432.yaml"
    # sdists only (as on a machine that reaches only PyPI): an sdist vendors one commit, no history
    path.write_text(path.read_text().replace("    - git: https://github.com/ggml-org/llama.cpp\n", ""))
    recipe = load_recipe(project.root, "archive/host-f53577432")
    assert recipe.upstream.commit == PIN_0_3_21

    report = roll.roll(project.settings, recipe, to=("pypi:llama-cpp-python==0.3.24",), environ=os.environ)
    (result,) = report.results
    assert result.candidate.commit == PIN_0_3_24
    (patch,) = result.plan.check.patches
    assert patch.verdict is Verdict.UPSTREAMED and patch.proof is not None and patch.proof.kind == "reverse-apply"
    assert result.would_drop == (BACKPORT,)
    assert result.plan.check.history.startswith("missing") and result.plan.check.commits_between is None
    assert any(note.startswith("history missing") for note in result.plan.check.notes)
    steps = {s.kind: s for s in result.steps}
    assert steps["sync"].status is StepStatus.PASSED
    assert steps["build"].status is StepStatus.PASSED, steps["build"].detail  # llama.cpp 0.3.24 built for this host
    assert steps["tests"].status is StepStatus.SKIPPED and steps["tests"].detail == "no live patch names a test"
    assert steps["plan"].status is StepStatus.PASSED and "toolchains not available here" in steps["plan"].detail
    assert result.outcome is Outcome.ROLLABLE
    text = roll.markdown(report)
    assert f"would drop as upstreamed: {BACKPORT} (reverse-apply:" in text
    assert f"| {BACKPORT} | upstreamed |" in text
    assert (project.root / "recipes" / "archive" / "host-f53577432.yaml").read_text() == path.read_text()  # nothing written
