"""Slow tier: a real host build of the pinned upstream (recipe demo-host, from the PyPI sdist) with
the stack.

The build is the session's ``real_host_build`` (fixtures_build), shared with the other slow tests
that run llama.cpp. Caches persist between runs (see fixtures_build.real_project): the first run
on a machine builds for several minutes on two cores; later runs reuse the artifact in seconds.
"""

from __future__ import annotations

import json
import re

import pytest

from kzbuild.measure.tinymodel import write_tiny_model
from tests.conftest import PIN_0_3_36
from tests.fixtures_build import build_real, run_from_artifact

pytestmark = pytest.mark.slow


def test_artifact_holds_the_tools_and_their_libraries(real_host_build):
    artifact = real_host_build.artifact
    assert {"llama-bench", "llama-completion", "test-backend-ops"} <= set(artifact.tools)
    assert {"libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so"} <= set(artifact.libs)
    manifest = artifact.manifest
    assert manifest["inputs"]["upstream"]["commit"] == PIN_0_3_36
    assert manifest["build_commit"] == artifact.build_commit
    assert f"-DLLAMA_BUILD_COMMIT={artifact.build_commit}" in manifest["cmake"]["configure"]
    assert artifact.build_commit.startswith(PIN_0_3_36[:7] + "-kz")


def test_gated_delta_net_passes_on_the_cpu(real_host_build):
    result = run_from_artifact(
        real_host_build.artifact, "test-backend-ops", "test", "-b", "CPU", "-o", "GATED_DELTA_NET"
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    match = re.search(r"(\d+)/(\d+) tests passed", result.stdout)
    assert match, result.stdout[-2000:]
    passed, total = int(match.group(1)), int(match.group(2))
    assert passed > 0 and passed == total


def test_llama_bench_runs_a_tiny_qwen35_and_reports_this_build(real_host_build, tmp_path):
    model = write_tiny_model(tmp_path / "tiny-qwen35.gguf", arch="qwen35", ftype="f32")
    result = run_from_artifact(
        real_host_build.artifact,
        "llama-bench",
        "-m",
        str(model),
        "-p",
        "16",
        "-n",
        "4",
        "-t",
        "1",
        "-r",
        "1",
        "-o",
        "json",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads(result.stdout)
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(16, 0), (0, 4)]
    for record in records:
        assert record["build_commit"] == real_host_build.artifact.build_commit
        assert record["n_threads"] == 1 and record["avg_ts"] > 0


def test_building_again_reuses_the_artifact(real_host_build, tmp_path):
    again = build_real(tmp_path, "host")
    assert again.reused and again.artifact.build_id == real_host_build.artifact.build_id
