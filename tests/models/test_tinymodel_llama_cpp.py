"""Slow tier: a real llama.cpp build loads and runs every tiny model.

The binaries come from the session's host artifact (``real_host_build`` in tests/fixtures_build.py:
kzbuild builds the pinned tree once, or reuses the cached artifact).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

from kzbuild.measure.tinymodel import ARCHS, FTYPES
from kzbuild.model.build import BuildResult
from tests.fixtures_build import run_from_artifact

pytestmark = pytest.mark.slow

ALL_MODELS = [(arch, ftype) for arch in ARCHS for ftype in FTYPES]


@pytest.fixture
def run_tool(real_host_build: BuildResult) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a tool of the host artifact; it must exit 0."""

    def run(
        tool: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = run_from_artifact(real_host_build.artifact, tool, *args, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return result

    return run


@pytest.mark.parametrize("arch,ftype", ALL_MODELS)
def test_llama_bench_gives_json_for_every_model(run_tool, tiny_models, arch, ftype):
    model = tiny_models[(arch, ftype)]
    result = run_tool(
        "llama-bench", "-m", str(model), "-p", "16", "-n", "8", "-t", "1", "-r", "1", "-o", "json"
    )
    records = json.loads(result.stdout)
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(16, 0), (0, 8)]
    label = {"f32": "all F32", "f16": "F16", "q4_0": "Q4_0"}[ftype]
    for record in records:
        assert record["model_type"] == f"{arch} ?B {label}"
        assert record["model_size"] > 0 and record["avg_ts"] > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_completion_generates(run_tool, tiny_models, arch):
    # llama-completion prints through common/log.cpp's background thread, which upstream
    # leaks on purpose (llama.cpp issue 22142): a run this short can exit before the thread
    # has written its queue, losing output although it succeeded. So every run must exit 0,
    # and one of a few must show the whole log.
    argv = (
        "-m",
        str(tiny_models[(arch, "q4_0")]),
        "-no-cnv",
        "-n",
        "8",
        "-p",
        "hi",
        "-t",
        "1",
        "--seed",
        "1",
    )
    for _ in range(5):
        result = run_tool("llama-completion", *argv)  # fails the test unless it exits 0
        if "prompt eval time" in result.stderr:
            break
    assert "prompt eval time" in result.stderr, "5 runs of llama-completion, none with its full log"
    assert result.stdout.startswith(" hi")  # the prompt echoed through the tokenizer and back


@pytest.mark.parametrize("arch", ARCHS)
def test_gated_delta_net_runs_on_the_cpu_for_qwen35_only(run_tool, tiny_models, arch):
    """GGML_SCHED_DEBUG=2 lists every node of each graph the scheduler runs, with its backend;
    llama-bench -v logs synchronously, so nothing is lost."""
    result = run_tool(
        "llama-bench",
        "-m",
        str(tiny_models[(arch, "q4_0")]),
        "-p",
        "16",
        "-n",
        "8",
        "-t",
        "1",
        "-r",
        "1",
        "-o",
        "json",
        "-v",
        env={"GGML_SCHED_DEBUG": "2"},
    )
    assert len(json.loads(result.stdout)) == 2
    nodes = [
        line for line in result.stderr.splitlines() if "(GATED_DELT)" in line
    ]  # op names are cut at 10
    if arch == "llama":
        assert nodes == []
        return
    assert nodes, "no GATED_DELTA_NET node in the qwen35 graphs"
    assert all("[  CPU" in line.split(":")[1] for line in nodes)
    # every graph holds the three gated delta net layers (0-2; layer 3 is full attention)
    assert len(nodes) % 3 == 0
    assert {"q_conv_predelta-0", "q_conv_predelta-2"} <= set(" ".join(nodes).split())
