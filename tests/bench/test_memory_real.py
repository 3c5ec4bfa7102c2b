"""Slow tier: memory measured on the real host build of the pin (the session's real_host_build,
with kz-peakrss built from kernels/peakrss/), a tiny qwen35 Q4_0 on a local device."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kzbuild.adapters.gitcmd import Git
from kzbuild.measure import memory
from kzbuild.measure.tinymodel import write_tiny_model
from kzbuild.model.build import BuildResult
from tests.bench.benchkit import stored_run_id, total_kib
from tests.conftest import persistent_test_cache

pytestmark = pytest.mark.slow


def test_a_real_bench_measures_peak_memory_and_buffers_and_a_low_budget_exits_15(
    kz, real_host_build: BuildResult, tmp_path: Path
):
    assert real_host_build.artifact.local("bin/kz-peakrss").is_file()
    spec = f"local:{tmp_path / 'device'}"
    model = write_tiny_model(tmp_path / "tiny-qwen35.gguf", arch="qwen35", ftype="q4_0")
    assert (
        kz("deploy", "--device", spec, "--artifact", str(real_host_build.artifact.path)).code == 0
    )
    assert kz("models", "push", str(model), "--device", spec).code == 0
    plan = tmp_path / "plan.yaml"
    runs = "runs:\n  - name: tiny\n    options: {p: 16, n: 4, t: 1, r: 1}\n"
    plan.write_text(
        f"model: {{name: tiny-qwen35.gguf, sha256: null}}\n"
        f"memory_budget: {model.stat().st_size // 1024}KiB\n{runs}"
    )
    result = kz("bench", "--plan", str(plan), "--device", spec, "--json")
    assert result.code == 15, result.err
    records = json.loads(result.out)["runs"][0]["records"]
    assert {r["test"] for r in records} == {"pp16", "tg4"}
    for item in records:
        peak_kib = item["memory"]["peak_rss_kib"]
        assert model.stat().st_size < peak_kib * 1024 < total_kib() * 1024
        buffers = {(name, kind) for name, kind, _ in item["memory"]["buffers"]}
        assert {("CPU_REPACK", "model"), ("CPU", "compute"), ("CPU", "kv")} <= buffers
        assert item["memory_over"] == ["memory_budget"]
        assert (
            item["provenance"]["build_id"] == real_host_build.artifact.build_id
            and item["provenance"]["toolchains"]
        )


def test_the_synced_trees_buffer_lines_are_the_ones_the_parser_reads(real_host_build: BuildResult):
    worktree = persistent_test_cache() / "kz-work" / "src" / "demo-host"
    git = Git(worktree)
    memory.check_tree_formats(
        {
            path: git.run("show", f"HEAD:{path}").stdout
            for path in [*memory.EXPECTED_FORMATS, *memory.PREFIX_FORMATS]
        },
        str(worktree),
    )


def test_the_deployed_binary_names_its_build_id_as_kzbuild_does(
    kz, real_host_build: BuildResult, tmp_path: Path
):
    """The tools' version line ends with +BUILD-ID; that build records the kzbuild version that
    --version prints."""
    spec = f"local:{tmp_path / 'device'}"
    assert (
        kz("deploy", "--device", spec, "--artifact", str(real_host_build.artifact.path)).code == 0
    )
    ran = kz("run", "--device", spec, "llama-completion", "--version")
    assert ran.code == 0, ran.err
    line = next(line for line in ran.err.splitlines() if line.startswith("version: "))
    assert line.endswith(f"+{real_host_build.artifact.build_id})")
    manifest = json.loads(real_host_build.artifact.manifest_path.read_text())
    assert manifest["build_id"] == real_host_build.artifact.build_id
    assert kz("--version").out.strip() == f"kzbuild {manifest['kzbuild_version']}"
    # kzbuild run measured the tool's process too: kz-peakrss's line comes last
    assert memory.parse_peak(ran.err) is not None


def test_kzbuild_run_of_the_real_llama_completion_stores_its_peak_and_buffers(
    kz, real_host_build: BuildResult, tmp_path: Path
):
    """kzbuild run keeps a record of the real tool's run: its peak above the model file, the
    buffers its log names, its provenance; a budget of the model file's size exits 15."""
    spec = f"local:{tmp_path / 'device'}"
    model = write_tiny_model(tmp_path / "tiny-qwen35.gguf", arch="qwen35", ftype="q4_0")
    assert (
        kz("deploy", "--device", spec, "--artifact", str(real_host_build.artifact.path)).code == 0
    )
    assert kz("models", "push", str(model), "--device", spec).code == 0
    args = ["llama-completion", "-v", "-m", "models/tiny-qwen35.gguf", "-p", "hi", "-n", "0"]
    ran = kz("run", "--device", spec, *args, "-t", "1", "-no-cnv")
    assert ran.code == 0, ran.err
    (record,) = json.loads(kz("results", "show", stored_run_id(ran.err), "--json").out)
    assert model.stat().st_size < record["memory"]["peak_rss_kib"] * 1024 < total_kib() * 1024
    buffers = {(name, kind) for name, kind, _ in record["memory"]["buffers"]}
    assert {("CPU_REPACK", "model"), ("CPU", "compute"), ("CPU", "kv")} <= buffers
    assert record["provenance"]["build_id"] == real_host_build.artifact.build_id
    assert record["provenance"]["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    budget = f"{model.stat().st_size // 1024}KiB"
    over = kz("run", "--device", spec, "--memory-budget", budget, *args, "-t", "1", "-no-cnv")
    assert over.code == 15, over.err
