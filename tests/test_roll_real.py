"""``kzbuild roll`` on real upstream sdists, with the real host build (slow tier)."""

from __future__ import annotations

import json
import os

import pytest

from kzbuild import roll
from kzbuild.model.roll import Outcome
from kzbuild.model.stackcheck import StepStatus, Verdict
from kzbuild.recipes import load_recipe
from kzbuild.tinymodel import write_tiny_model
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


class LocalLlamaBench:
    """The device runner a roll takes (``roll.ABRunner``), here through the kzbuild CLI: each run
    deploys the variant's artifact to the device (``current`` switches to it) and runs the real
    llama-bench there on a tiny model (pp16, one repetition)."""

    metric = "pp16 t/s"

    def __init__(self, kz, spec: str) -> None:  # type: ignore[no-untyped-def]
        self.kz = kz
        self.spec = spec
        self.ran: list[tuple[str, str]] = []  # (variant, build id the bench record names)

    def run(self, variants, order):  # type: ignore[no-untyped-def]
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for block in order:
            for name in block:
                deployed = self.kz("deploy", "--device", self.spec, "--artifact", str(variants[name]))
                assert deployed.code == 0, deployed.err
                result = self.kz("bench", "--device", self.spec, "-m", "models/tiny.gguf", "-p", "16", "-n", "0", "-r", "1", "-t", "1", "--json")
                assert result.code == 0, result.err
                (record,) = json.loads(result.out)["records"]
                samples[name] += record["samples_ts"]
                self.ran.append((name, record["build"]["build_id"]))
        return samples


def test_the_bench_step_runs_pin_and_candidate_interleaved_on_a_local_device(kz, tmp_path):
    """demo-host rolled to its own pin (no newer sdist exists offline): both variants are really
    built in their stages and benched ABAB with the real llama-bench; the report gives the delta."""
    project = private_project(tmp_path / "real")  # the kz fixture's own project is tmp_path/project
    spec = f"local:{tmp_path / 'device'}"
    assert kz("models", "push", str(write_tiny_model(tmp_path / "tiny.gguf", arch="llama", ftype="f32")), "--device", spec).code == 0
    runner = LocalLlamaBench(kz, spec)
    recipe = load_recipe(project.root, "demo-host")
    report = roll.roll(project.settings, recipe, to=("pypi:llama-cpp-python==0.3.36",), tests=False, plan_target=None,
                       bench=runner, blocks=3, seed=7, threshold_pct=50.0, environ=os.environ)
    (result,) = report.results
    assert [s.kind for s in result.steps] == ["sync", "build", "tests", "bench"], result.steps
    bench = result.bench
    assert bench is not None and len(bench.pin) == len(bench.candidate) == 3
    assert all(v > 0 for v in bench.pin + bench.candidate)
    assert [name for name, _ in runner.ran] == list(bench.order) and len(set(bench.order[:2])) == 2  # ABAB, seeded
    assert bench.low_pct <= bench.delta_pct <= bench.high_pct
    assert result.outcome is (Outcome.REGRESSED if bench.regressed else Outcome.ROLLABLE)
    assert f"{bench.metric}: {bench.delta_pct:+.1f}%" in roll.markdown(report)
