"""``kzbuild roll`` on real upstream sdists, with the real host build (slow tier)."""

from __future__ import annotations

import json
import os

import pytest

from kzbuild.cli import main
from kzbuild.measure import roll
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.tinymodel import write_tiny_model
from kzbuild.model.roll import Outcome
from kzbuild.model.stackcheck import StepStatus, Verdict
from kzbuild.source.recipes import load_recipe
from tests.conftest import PIN_0_3_21, PIN_0_3_24
from tests.fixtures_trees import private_project

pytestmark = pytest.mark.slow

BACKPORT = "common-signed-unaccounted-memory-backport-22424.patch"


def test_the_archive_recipe_rolled_to_0_3_24_drops_the_backport_builds_and_says_history_is_missing(
    tmp_path,
):
    project = private_project(tmp_path)
    path = project.root / "recipes" / "archive" / "host-f53577432.yaml"
    # sdists only (as on a machine that reaches only PyPI): an sdist vendors one commit, no history
    path.write_text(
        path.read_text().replace("    - git: https://github.com/ggml-org/llama.cpp\n", "")
    )
    recipe = load_recipe(project.root, "archive/host-f53577432")
    assert recipe.upstream.commit == PIN_0_3_21

    report = roll.roll(
        project.settings, recipe, to=("pypi:llama-cpp-python==0.3.24",), environ=os.environ
    )
    (result,) = report.results
    assert result.candidate.commit == PIN_0_3_24
    (patch,) = result.plan.check.patches
    assert (
        patch.verdict is Verdict.UPSTREAMED
        and patch.proof is not None
        and patch.proof.kind == "reverse-apply"
    )
    assert result.would_drop == (BACKPORT,)
    assert (
        result.plan.check.history.startswith("missing")
        and result.plan.check.commits_between is None
    )
    assert any(note.startswith("history missing") for note in result.plan.check.notes)
    steps = {s.kind: s for s in result.steps}
    assert steps["sync"].status is StepStatus.PASSED
    assert steps["build"].status is StepStatus.PASSED, steps[
        "build"
    ].detail  # llama.cpp 0.3.24 built for this host
    assert (
        steps["tests"].status is StepStatus.SKIPPED
        and steps["tests"].detail == "no live patch names a test"
    )
    assert (
        steps["plan"].status is StepStatus.PASSED
        and "toolchains not available here" in steps["plan"].detail
    )
    assert result.outcome is Outcome.ROLLABLE
    text = roll.markdown(report)
    assert f"would drop as upstreamed: {BACKPORT} (reverse-apply:" in text
    assert f"| {BACKPORT} | upstreamed |" in text
    assert (
        project.root / "recipes" / "archive" / "host-f53577432.yaml"
    ).read_text() == path.read_text()  # nothing written


def test_roll_with_a_device_benches_pin_and_candidate_interleaved_there(tmp_path, capsys):
    """`kzbuild roll --device --plan`: demo-host rolled to its own pin (no newer sdist exists
    offline); both are really built in their stages, deployed, and benched ABAB with the real
    llama-bench and a tiny model on a local device; the records carry their variant."""
    project = private_project(tmp_path / "real")
    root = [
        "--project",
        str(project.root),
        "--cache-dir",
        str(project.cache),
        "--work-dir",
        str(project.work),
        "--results-dir",
        str(tmp_path / "results"),
    ]
    spec = f"local:{tmp_path / 'device'}"
    assert (
        main(
            [
                *root,
                "models",
                "push",
                str(write_tiny_model(tmp_path / "tiny.gguf", arch="llama", ftype="f32")),
                "--device",
                spec,
            ]
        )
        == 0
    )
    plan = tmp_path / "roll-plan.yaml"
    plan.write_text(
        "model:\n  name: tiny.gguf\n  sha256: null\nrepetitions: 1\nruns:\n  - name: prefill\n    "
        "options: {p: 16, n: 0, t: 1}\nab:\n  blocks: 3\nseed: 7\nmemory_budget: 4GiB\n"
    )
    capsys.readouterr()
    code = main(
        [
            *root,
            "roll",
            "demo-host",
            "--to",
            "pypi:llama-cpp-python==0.3.36",
            "--no-tests",
            "--plan-target",
            "none",
            "--device",
            spec,
            "--plan",
            str(plan),
            "--threshold",
            "50",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    (result,) = json.loads(out)["candidates"]
    bench = result["bench"]
    assert bench is not None, result
    assert code == (9 if bench["regressed"] else 0)
    assert [s["kind"] for s in result["steps"]] == ["sync", "build", "tests", "bench"]
    assert bench["metric"] == "pp16 t/s" and len(bench["pin"]) == len(bench["candidate"]) == 3
    assert all(v > 0 for v in bench["pin"] + bench["candidate"])
    assert sorted(bench["order"]) == ["candidate"] * 3 + ["pin"] * 3
    assert bench["low_pct"] <= bench["delta_pct"] <= bench["high_pct"]
    assert bench["memory_over"] == []  # kz-peakrss measured each run, within the budget
    with ResultsStore(tmp_path / "results") as store:
        measured = [r for r in store.records() if r.variant is not None]
    variants = [r.variant.name for r in measured if r.variant is not None]
    assert variants == list(bench["order"])  # stored in run order, each with its variant
    assert all(r.memory and r.memory.peak_rss_kib for r in measured)
