"""Slow tier: the aarch64 cross build (``--target linux-arm64``) of the pinned upstream, run under
qemu-aarch64.

This is the stand-in tablet: the same CPU code the tablet runs, on this machine. Caches
persist between runs like the host build's.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from kzbuild.build import builder
from kzbuild.measure.tinymodel import write_tiny_model
from tests.conftest import have
from tests.fixtures_build import build_real

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (have("aarch64-linux-gnu-g++") and have("qemu-aarch64")),
        reason="needs g++-aarch64-linux-gnu and qemu-user",
    ),
]


@pytest.fixture(scope="module")
def arm64_build(tmp_path_factory: pytest.TempPathFactory) -> builder.BuildResult:
    return build_real(tmp_path_factory.mktemp("arm64-build"), "linux-arm64")


def test_artifact_is_aarch64_and_names_its_runner(arm64_build):
    artifact = arm64_build.artifact
    with open(artifact.local("bin/llama-bench"), "rb") as handle:
        header = handle.read(20)
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    runner = artifact.manifest["runner"]
    assert runner[0].endswith("qemu-aarch64") and runner[1:] == ["-L", "/usr/aarch64-linux-gnu"]


def test_llama_bench_runs_under_qemu_on_a_tiny_qwen35(arm64_build, tmp_path):
    artifact = arm64_build.artifact
    model = write_tiny_model(tmp_path / "tiny-qwen35-q4_0.gguf", arch="qwen35", ftype="q4_0")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    argv = [
        *artifact.manifest["runner"],
        str(artifact.local("bin/llama-bench")),
        "-m",
        str(model),
        "-p",
        "8",
        "-n",
        "2",
        "-t",
        "1",
        "-r",
        "1",
        "-o",
        "json",
    ]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads(result.stdout)
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(8, 0), (0, 2)]
    assert all(r["build_commit"] == artifact.build_commit and r["avg_ts"] > 0 for r in records)
