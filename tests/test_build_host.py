"""Slow tier: a real host build of the pinned upstream (recipe demo-host, from the PyPI sdist) with the stack.

Caches persist between runs (see fixtures_build.real_project): the first run on a machine
builds for about five minutes on two cores; later runs reuse the artifact in seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kzbuild import build as builds
from kzbuild.tinymodel import write_tiny_model
from tests.conftest import PIN_0_3_36
from tests.fixtures_build import build_real

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def host_build(tmp_path_factory: pytest.TempPathFactory) -> builds.BuildResult:
    return build_real(tmp_path_factory.mktemp("host-build"), "host")


def run_from_artifact(artifact_dir: Path, tool: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run a tool as a user would: from the artifact, with no LD_LIBRARY_PATH (the rpath finds lib/)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    return subprocess.run([artifact_dir / "bin" / tool, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_artifact_holds_the_tools_and_their_libraries(host_build):
    artifact = host_build.artifact
    assert {"llama-bench", "llama-completion", "test-backend-ops"} <= set(artifact.tools)
    assert {"libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so"} <= set(artifact.libs)
    manifest = artifact.manifest
    assert manifest["inputs"]["upstream"]["commit"] == PIN_0_3_36
    assert manifest["build_commit"] == artifact.build_commit
    assert f"-DLLAMA_BUILD_COMMIT={artifact.build_commit}" in manifest["cmake"]["configure"]
    assert artifact.build_commit.startswith(PIN_0_3_36[:7] + "-kz")


def test_gated_delta_net_passes_on_the_cpu(host_build):
    result = run_from_artifact(host_build.artifact.path, "test-backend-ops", "test", "-b", "CPU", "-o", "GATED_DELTA_NET")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    match = re.search(r"(\d+)/(\d+) tests passed", result.stdout)
    assert match, result.stdout[-2000:]
    passed, total = int(match.group(1)), int(match.group(2))
    assert passed > 0 and passed == total


def test_llama_bench_runs_a_tiny_qwen35_and_reports_this_build(host_build, tmp_path):
    model = write_tiny_model(tmp_path / "tiny-qwen35.gguf", arch="qwen35", ftype="f32")
    result = run_from_artifact(host_build.artifact.path, "llama-bench", "-m", str(model), "-p", "16", "-n", "4", "-t", "1", "-r", "1", "-o", "json")
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads(result.stdout)
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(16, 0), (0, 4)]
    for record in records:
        assert record["build_commit"] == host_build.artifact.build_commit
        assert record["n_threads"] == 1 and record["avg_ts"] > 0


def test_building_again_reuses_the_artifact(host_build, tmp_path):
    again = build_real(tmp_path, "host")
    assert again.reused and again.artifact.build_id == host_build.artifact.build_id
