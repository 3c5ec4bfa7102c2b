"""Slow tier: a real llama.cpp build loads and runs every tiny model.

The binaries come from KZ_LLAMA_BIN_DIR (a folder with llama-bench and llama-completion,
e.g. a host build's bin/); without it these tests skip and say why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kzbuild import proc
from kzbuild.tinymodel import ARCHS, FTYPES

pytestmark = pytest.mark.slow

ALL_MODELS = [(arch, ftype) for arch in ARCHS for ftype in FTYPES]


@pytest.fixture(scope="module")
def llama_bin() -> Path:
    configured = os.environ.get("KZ_LLAMA_BIN_DIR")
    if not configured:
        pytest.skip("KZ_LLAMA_BIN_DIR is not set: point it at a llama.cpp build's bin/ folder to run these")
    folder = Path(configured)
    for tool in ("llama-bench", "llama-completion"):
        if not (folder / tool).is_file():
            pytest.skip(f"KZ_LLAMA_BIN_DIR={folder} has no {tool}")
    return folder


def run_tool(llama_bin: Path, tool: str, *args: str, env: dict[str, str] | None = None) -> proc.Result:
    libraries = f"{llama_bin}:{llama_bin.parent / 'lib'}"
    return proc.run([llama_bin / tool, *args], env={"LD_LIBRARY_PATH": libraries, **(env or {})}, timeout=300)


@pytest.mark.parametrize("arch,ftype", ALL_MODELS)
def test_llama_bench_gives_json_for_every_model(llama_bin, tiny_models, arch, ftype):
    model = tiny_models[(arch, ftype)]
    result = run_tool(llama_bin, "llama-bench", "-m", str(model), "-p", "16", "-n", "8", "-t", "1", "-r", "1", "-o", "json")
    records = json.loads(result.stdout)
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(16, 0), (0, 8)]
    label = {"f32": "all F32", "f16": "F16", "q4_0": "Q4_0"}[ftype]
    for record in records:
        assert record["model_type"] == f"{arch} ?B {label}"
        assert record["model_size"] > 0 and record["avg_ts"] > 0


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_llama_completion_generates(llama_bin, tiny_models, arch):
    result = run_tool(llama_bin, "llama-completion", "-m", str(tiny_models[(arch, "q4_0")]), "-no-cnv", "-n", "8", "-p", "hi", "-t", "1", "--seed", "1")
    assert result.stdout.startswith(" hi")  # the prompt echoed through the tokenizer and back
    assert "prompt eval time" in result.stderr


def test_qwen35_runs_gated_delta_net_on_the_cpu(llama_bin, tiny_models):
    """The scheduler's debug dump lists the nodes of every graph it runs, with their backend."""
    scheduled = {}
    for arch in ("qwen35", "llama"):
        result = run_tool(
            llama_bin, "llama-completion", "-m", str(tiny_models[(arch, "q4_0")]), "-no-cnv", "-n", "4", "-p", "hi", "-t", "1", "-v",
            env={"GGML_SCHED_DEBUG": "2"},
        )
        scheduled[arch] = [line for line in result.stderr.splitlines() if "(GATED_DELT)" in line]  # op names cut at 10
    assert scheduled["qwen35"], "no GATED_DELTA_NET node in the qwen35 graphs"
    assert all("[  CPU" in line for line in scheduled["qwen35"])
    # every scheduled graph holds the three gated delta net layers (0-2; layer 3 is full attention)
    assert len(scheduled["qwen35"]) % 3 == 0
    assert scheduled["llama"] == []
