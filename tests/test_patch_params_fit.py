"""params_fit counts CPU_REPACK as host memory
(patches/common-fit-counts-CPU_REPACK-as-host-memory.patch).

Slow tier, through kzbuild: the pin is built for the host twice, with the stack (demo-host)
and with the stack minus this patch, and llama-completion loads a 15 MiB Q4_0 model with
``-dev none -v``. The CPU backend repacks the Q4_0 matrices into one of its extra buffer types:
CPU_REPACK on AVX2 or arm64, AMX on CPUs with AMX. Before the patch fit's host projection leaves
those weights out; after it, it holds them. The memory breakdown table
(common_memory_breakdown_print) is the same in both builds: it lists the extra buffer type in a
row of its own. The object cache and ccache persist between runs
(tests/fixtures_trees.private_project).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from kzbuild.build import builder
from kzbuild.source.recipes import load_recipe
from kzbuild.source.stack.series import read_series
from tests.fixtures_fit import weight_bytes, write_wide_q4_0_llama
from tests.fixtures_trees import private_project

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
PATCH = "common-fit-counts-CPU_REPACK-as-host-memory.patch"


@dataclass(frozen=True)
class HostMemory:
    """What one run reports about host memory (MiB)."""

    extra_buffer: (
        str  # the CPU's extra buffer type that holds the repacked weights (CPU_REPACK, AMX)
    )
    host_model: int  # memory breakdown table, Host row, model column
    extra_row_model: int  # memory breakdown table, the extra buffer type's row, model column
    fit_projected: int  # params_fit: "projected to use N MiB of host memory"
    extra_loaded: (
        float  # load_tensors: the extra buffer type's model buffer, when the model is really loaded
    )


def without_patch(project_root: Path, base: str, patch: str) -> str:
    """Write a recipe that is ``base`` with ``patch`` left out of its series; return its name."""
    recipe = load_recipe(project_root, base)
    names = [name for name in read_series(recipe.series).names() if name != patch]
    assert len(names) == len(read_series(recipe.series).names()) - 1, (
        f"{patch} is not in {recipe.series}"
    )
    (project_root / "patches" / f"without-{patch}.series").write_text(
        "".join(f"{n}\n" for n in names)
    )
    text = recipe.path.read_text().replace(
        "patches: patches/series", f"patches: patches/without-{patch}.series"
    )
    (project_root / "recipes" / f"{base}-without-fit.yaml").write_text(text)
    return f"{base}-without-fit"


@pytest.fixture(scope="module")
def completion(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    project = private_project(tmp_path_factory.mktemp("fit"))
    baseline = without_patch(project.root, "demo-host", PATCH)
    tools = {}
    for label, recipe in (("patched", "demo-host"), ("baseline", baseline)):
        prepared = builder.prepare(
            project.settings,
            load_recipe(project.root, recipe),
            "host",
            environ=os.environ,
            options=builder.BuildOptions(jobs=2),
        )
        tools[label] = builder.build(prepared).artifact.path / "bin" / "llama-completion"
    return tools


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wide_q4_0_llama(tmp_path_factory.mktemp("model") / "wide-q4_0.gguf")


# Buffer types of the CPU device that are host buffers. With -dev none every buffer belongs to
# the CPU device, so any other buffer type in the log is one of its extra buffer types.
CPU_HOST_BUFFERS = {"CPU", "CPU_Mapped"}


def host_memory(completion_tool: Path, model: Path) -> HostMemory:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    # No prompt and no warmup: every figure comes from fit and from loading, and computing would
    # run the extra buffer type's kernels (AMX ones die with SIGILL on VMs that hide AMX state).
    argv = [
        str(completion_tool),
        "-m",
        str(model),
        "-dev",
        "none",
        "-v",
        "-no-cnv",
        "-p",
        "",
        "-n",
        "0",
        "--no-warmup",
        "-t",
        "1",
        "-c",
        "256",
    ]
    result = subprocess.run(
        argv, env=env, capture_output=True, text=True, errors="replace", timeout=600
    )  # random weights: any bytes
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    loaded = {
        name: float(size)
        for name, size in re.findall(
            r"load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB", log
        )
    }
    extra = sorted(
        name for name, size in loaded.items() if name not in CPU_HOST_BUFFERS and size > 0
    )
    if not extra:
        pytest.skip(
            "the CPU backend put none of this Q4_0 model's weights in an extra buffer type here "
            "(no CPU_REPACK "
            "or AMX model buffer in the log): nothing for the patch to count"
        )
    assert len(extra) == 1, f"several CPU extra buffer types hold weights: {extra}"
    host_row = re.search(r"- Host\s*\|\s*\d+\s*=\s*(\d+)\s*\+", log)
    extra_row = re.search(rf"- {re.escape(extra[0])}\s*\|\s*\d+\s*=\s*(\d+)\s*\+", log)
    projected = re.search(r"projected to use (\d+) MiB of host memory", log)
    assert host_row and extra_row and projected, log[-3000:]
    return HostMemory(
        extra_buffer=extra[0],
        host_model=int(host_row.group(1)),
        extra_row_model=int(extra_row.group(1)),
        fit_projected=int(projected.group(1)),
        extra_loaded=loaded[extra[0]],  # the last one: fit's no-alloc pass prints 0.00 first
    )


def test_fit_with_dev_none_counts_repacked_weights_as_host_memory(completion, model):
    weights = weight_bytes(model) // MiB
    before = host_memory(completion["baseline"], model)
    after = host_memory(completion["patched"], model)
    # the extra buffer type (CPU_REPACK, or AMX on CPUs with AMX) really holds the weights in
    # both builds
    assert after.extra_buffer == before.extra_buffer
    assert before.extra_loaded >= weights - 1 and after.extra_loaded == before.extra_loaded
    # fit's host projection (-dev none: the model has no devices) gains the repacked weights
    assert after.fit_projected - before.fit_projected >= weights - 1
    # the memory breakdown table is upstream's in both: the extra buffer type in its own row,
    # Host without it
    assert before.extra_row_model >= weights - 1 and before.host_model < weights
    assert (after.extra_row_model, after.host_model) == (before.extra_row_model, before.host_model)
