"""Slow tier: kzbuild ab on the real pinned llama.cpp and the team's stack, built for the host
through
kzbuild (persistent caches), benched with the real llama-bench and a tiny qwen35 model on a local
device and, reusing every build, on a device over ssh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kzbuild.cli import main
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.tinymodel import write_tiny_model
from kzbuild.model.build import BuildResult
from tests.conftest import CliResult, Project
from tests.fixtures_build import real_project

pytestmark = pytest.mark.slow

HEXAGON = "ggml-hexagon-accept-gated_delta_net-when-its-hvx-kernel-fits.patch"
FIT = "common-fit-counts-CPU_REPACK-as-host-memory.patch"
BENCH = ("-m", "models/tiny-qwen35.gguf", "-p", "16", "-n", "4", "-r", "2", "-t", "1")


def run(project: Project, capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    capsys.readouterr()
    code = main(
        [
            "--project",
            str(project.root),
            "--cache-dir",
            str(project.cache),
            "--work-dir",
            str(project.work),
            *args,
        ]
    )
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


@pytest.fixture
def real_ab_project(tmp_path: Path) -> Project:
    """The repo's recipes and stack over the persistent caches; requested before ssh_home, which
    moves HOME (and with it the default cache)."""
    return real_project(tmp_path)


def test_every_variant_of_the_real_stack_builds_deploys_and_benches(
    tmp_path: Path, capsys, real_host_build: BuildResult, real_ab_project: Project, sshd, ssh_home
):  # type: ignore[no-untyped-def]
    project = real_ab_project
    assert str(project.cache).startswith(
        str(real_host_build.artifact.path.parents[2])
    )  # the persistent caches, not the ssh session's HOME
    model = write_tiny_model(tmp_path / "tiny-qwen35.gguf", arch="qwen35", ftype="q4_0")
    local = f"local:{tmp_path / 'device'}"
    assert run(project, capsys, "models", "push", str(model), "--device", local).code == 0

    result = run(
        project,
        capsys,
        "ab",
        "demo-host",
        "--device",
        local,
        *BENCH,
        "--blocks",
        "2",
        "--seed",
        "3",
        "--json",
    )
    assert result.code == 0, result.err
    report = json.loads(result.out)
    variants = {v["spec"]["name"]: v for v in report["variants"]}
    # the backport is upstream at the pin (sync skips it): not a live patch, so no variant of
    # its own
    assert list(variants) == ["full", f"minus:{HEXAGON}", f"minus:{FIT}", "upstream"]
    assert all(v["problem"] is None for v in variants.values())
    ids = {name: v["build_id"] for name, v in variants.items()}
    assert len(set(ids.values())) == 4
    assert (
        ids["full"] == real_host_build.artifact.build_id
    )  # the full stack is the recipe's own build
    effects = {(e["variant"], e["test"]) for e in report["effects"]}
    assert effects == {
        (name, test) for name in variants if name != "full" for test in ("pp16", "tg4")
    }
    assert all(e["effect"]["samples_a"] == e["effect"]["samples_b"] == 2 for e in report["effects"])
    assert report["checks"] == []  # the stack declares no Kz-Expect
    with ResultsStore(project.root / "results") as store:
        stored = store.records(report["runs"][0]["run_id"])
    assert len(stored) == 16 and {r.variant.name for r in stored if r.variant} == set(variants)
    assert {r.build.build_id for r in stored if r.variant and r.variant.name == "upstream"} == {
        ids["upstream"]
    }
    # one scratch worktree and build dir: after the first variant built there, the others compile
    # only what their patches change (and build-info); ccache stats as each artifact's
    # manifest recorded them
    compiled = {}
    for name, variant in variants.items():
        if not variant["reused"]:
            stats = (
                json.loads((project.work / "artifacts" / ids[name] / "manifest.json").read_text())[
                    "ccache"
                ]
                or {}
            )
            compiled[name] = stats.get("hits", 0) + stats.get("misses", 0)
    print("compiled per variant:", compiled)
    # a rerun on warm caches reuses every variant's artifact and compiles nothing: the counts are
    # only this run's to check when it built some (a cold run builds all four)
    if compiled:
        first, *later = sorted(compiled.values(), reverse=True)
        assert all(n <= 10 for n in later), compiled
    else:
        assert all(variant["reused"] for variant in variants.values())

    # over ssh: the same builds, deployed to another device
    remote = sshd.spec(tmp_path / "remote")
    assert run(project, capsys, "models", "push", str(model), "--device", remote).code == 0
    again = run(
        project,
        capsys,
        "ab",
        "demo-host",
        "--device",
        remote,
        *BENCH,
        "--blocks",
        "1",
        "--seed",
        "4",
        "--json",
    )
    assert again.code == 0, again.err
    second = json.loads(again.out)
    assert [(v["spec"]["name"], v["build_id"], v["reused"]) for v in second["variants"]] == [
        (name, ids[name], True) for name in variants
    ]
    assert {e["variant"] for e in second["effects"]} == set(variants) - {"full"}
