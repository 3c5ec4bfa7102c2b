"""params_fit counts CPU_REPACK as host memory (patches/common-fit-counts-CPU_REPACK-as-host-memory.patch).

Slow tier, through kzbuild: the pin is built for the host twice, with the stack (demo-host)
and with the stack minus this patch, and llama-completion runs a 15 MiB Q4_0 model with
``-dev none -v``. This host has AVX2, so the CPU backend repacks the Q4_0 matrices into
CPU_REPACK. Before the patch the host figures leave those weights out; after it they hold
them. The object cache and ccache persist between runs (tests/fixtures_trees.private_project).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from kzbuild import build as builds
from kzbuild.recipes import load_recipe
from kzbuild.stack import read_series
from tests.fixtures_fit import weight_bytes, write_wide_q4_0_llama
from tests.fixtures_trees import private_project

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
PATCH = "common-fit-counts-CPU_REPACK-as-host-memory.patch"


@dataclass(frozen=True)
class HostMemory:
    """What one run reports about host memory, from the fit step at start-up (MiB)."""

    host_model: int  # memory breakdown, Host row, model column
    repack_row_model: int | None  # memory breakdown, CPU_REPACK row (None: no such row, it is in Host)
    fit_projected: int  # params_fit: "projected to use N MiB of host memory"
    repack_loaded: float  # load_tensors: CPU_REPACK model buffer size, when the model is really loaded


def without_patch(project_root: Path, base: str, patch: str) -> str:
    """Write a recipe that is ``base`` with ``patch`` left out of its series; return its name."""
    recipe = load_recipe(project_root, base)
    names = [name for name in read_series(recipe.series).names() if name != patch]
    assert len(names) == len(read_series(recipe.series).names()) - 1, f"{patch} is not in {recipe.series}"
    (project_root / "patches" / f"without-{patch}.series").write_text("".join(f"{n}\n" for n in names))
    text = recipe.path.read_text().replace("patches: patches/series", f"patches: patches/without-{patch}.series")
    (project_root / "recipes" / f"{base}-without-fit.yaml").write_text(text)
    return f"{base}-without-fit"


@pytest.fixture(scope="module")
def completion(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    project = private_project(tmp_path_factory.mktemp("fit"))
    baseline = without_patch(project.root, "demo-host", PATCH)
    tools = {}
    for label, recipe in (("patched", "demo-host"), ("baseline", baseline)):
        prepared = builds.prepare(project.settings, load_recipe(project.root, recipe), "host", environ=os.environ,
                                  options=builds.BuildOptions(jobs=2))
        tools[label] = builds.build(prepared).artifact.path / "bin" / "llama-completion"
    return tools


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wide_q4_0_llama(tmp_path_factory.mktemp("model") / "wide-q4_0.gguf")


def host_memory(completion_tool: Path, model: Path) -> HostMemory:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    argv = [str(completion_tool), "-m", str(model), "-dev", "none", "-v", "-no-cnv", "-p", "hello", "-n", "1", "-t", "1", "-c", "256"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, errors="replace", timeout=600)  # random weights: any bytes
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    if "REPACK = 1" not in log:
        pytest.skip("this CPU has no repack path for Q4_0 (it needs AVX2 or arm64): nothing to count")
    host_row = re.search(r"- Host\s*\|\s*\d+\s*=\s*(\d+)\s*\+", log)
    repack_row = re.search(r"- CPU_REPACK\s*\|\s*\d+\s*=\s*(\d+)\s*\+", log)
    projected = re.search(r"projected to use (\d+) MiB of host memory", log)
    loaded = re.findall(r"CPU_REPACK model buffer size =\s*([\d.]+) MiB", log)
    assert host_row and projected and loaded, log[-3000:]
    return HostMemory(
        host_model=int(host_row.group(1)),
        repack_row_model=int(repack_row.group(1)) if repack_row else None,
        fit_projected=int(projected.group(1)),
        repack_loaded=float(loaded[-1]),  # the first one is fit's no-alloc pass, 0.00
    )


def test_host_model_memory_counts_repacked_weights(completion, model):
    weights = weight_bytes(model) // MiB
    before = host_memory(completion["baseline"], model)
    after = host_memory(completion["patched"], model)
    # CPU_REPACK really holds the weights in both builds
    assert before.repack_loaded >= weights - 1 and after.repack_loaded == before.repack_loaded
    # without the patch the breakdown lists CPU_REPACK apart and the host model figure misses it
    assert before.repack_row_model is not None and before.repack_row_model >= weights - 1
    assert before.host_model < weights
    # with it the repacked weights are host memory: no separate row, and fit projects them too
    assert after.repack_row_model is None
    assert after.host_model >= weights
    assert after.fit_projected - before.fit_projected >= weights - 1
