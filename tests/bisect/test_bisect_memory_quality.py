"""kzbuild bisect of memory and quality on a tiny upstream (real git, builds, a local device): one
commit makes llama-bench hold 64 MiB more (its real peak, measured by the real kz-peakrss, and the
buffer it logs as llama.cpp does), another perturbs the logits llama-perplexity compares; bisect
names each with --metric peak-memory, buffer:CPU:model and kld."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kzbuild.measure.quality import quality_store
from tests.ab.conftest import LOGIT, SPEED, STAND_IN, STAND_IN_PLAN
from tests.bisect.conftest import bisect_args
from tests.conftest import REPO_ROOT
from tests.fixtures_build import Tiny

PLAN = STAND_IN_PLAN + "seed: 3\n"
# ggml that holds MIB MiB (written, so resident) and logs it as llama.cpp logs a model buffer
HOLDING = r"""#include <stdio.h>
#include <stdlib.h>
#include <string.h>
double ggml_speed(void) {
    size_t bytes = (size_t) MIB << 20;
    char * held = malloc(bytes);
    memset(held, 1, bytes);
    fprintf(stderr, "load_tensors:          CPU model buffer size = %8.2f MiB\n", (double) MIB);
    return 99.0 + held[bytes - 1];
}
"""


def device(tiny: Tiny, device_root: Path, plan: str) -> str:
    tiny.project.write(
        "recipes/devices.yaml", f"devices:\n  box:\n    transport: local\n    root: {device_root}\n"
    )
    (device_root / "models").mkdir(parents=True)
    (device_root / "models" / "q.gguf").write_bytes(STAND_IN)
    return str(tiny.project.write("plans/bisect.yaml", plan))


def history(tiny: Tiny, changed_at: int, files: dict[str, str], base: dict[str, str]) -> list[str]:
    """The good end (``base`` over the pin), then 24 commits; commit ``changed_at`` writes
    ``files``."""
    shas = [tiny.upstream.commit(base, "ggml: the good end")]
    for n in range(1, 25):
        subject = f"docs: change {n}"
        changes = {"docs/log.txt": f"change {n}\n"}
        if n == changed_at:
            changes |= files
            subject = "ggml: a change (#77)"
        shas.append(tiny.upstream.commit(changes, subject))
    return shas


def bisect(kz, shas: list[str], plan: str, metric: str):  # type: ignore[no-untyped-def]
    return kz(*bisect_args(shas, plan), "--metric", metric, "--json")


def test_bisect_names_the_commit_that_raised_the_peak_memory_and_the_buffer(
    kz, bench_tiny, tmp_path
):
    recipe = bench_tiny.project.root / "recipes" / "tiny.yaml"
    recipe.write_text(
        recipe.read_text().replace(
            "  targets: [host]\n", "  targets: [host]\n  tools: [llama-bench, kz-peakrss]\n"
        )
    )
    shutil.copytree(
        REPO_ROOT / "kernels" / "peakrss", bench_tiny.project.root / "kernels" / "peakrss"
    )
    plan = device(bench_tiny, tmp_path / "device", PLAN)
    grows = {"ggml/src/ggml.c": HOLDING.replace("MIB", "68")}
    shas = history(bench_tiny, 17, grows, {"ggml/src/ggml.c": HOLDING.replace("MIB", "4")})

    peak = bisect(kz, shas, plan, "peak-memory")
    assert peak.code == 0, peak.err
    report = json.loads(peak.out)
    assert report["outcome"] == "found" and report["culprit"]["sha"] == shas[17]
    assert report["metric"] == "prefill:peak-memory MiB" and report["pr"] == 77
    assert report["effect"]["low_pct"] > 100 and report["effect_unit"] == "%"  # 64 MiB more
    tried = {c["index"]: c for c in report["commits"]}
    assert tried[0]["samples"]["box"][0] > 4 and tried[24]["samples"]["box"][0] > 68  # MiB
    assert report["builds"] - report["built_ahead_unused"] <= 8

    buffer = bisect(kz, shas, plan, "buffer:CPU:model")
    assert buffer.code == 0, buffer.err
    report = json.loads(buffer.out)
    assert (
        report["culprit"]["sha"] == shas[17] and report["metric"] == "prefill:buffer:CPU:model MiB"
    )
    tried = {c["index"]: c for c in report["commits"]}
    assert set(tried[0]["samples"]["box"]) == {4.0} and set(tried[24]["samples"]["box"]) == {68.0}

    unknown = bisect(kz, shas, plan, "buffer:CPU:weights")
    assert unknown.code == 2 and "no buffer kind 'weights'" in unknown.err


def test_bisect_names_the_commit_that_made_the_output_wrong(kz, quality_tiny, tmp_path):
    plan = device(quality_tiny, tmp_path / "device", PLAN + "quality:\n  max_kld: 0.01\n")
    perturbed = LOGIT.replace("/ 4.0f;", "/ 4.0f + (float) ((pos * tok) % 5) * 0.6f;")
    shas = history(
        quality_tiny,
        9,
        {"ggml/src/ggml.c": SPEED + perturbed},
        {"ggml/src/ggml.c": SPEED.replace("100.0", "101.0") + LOGIT},
    )
    found = bisect(kz, shas, plan, "kld")
    assert found.code == 0, found.err
    report = json.loads(found.out)
    assert report["outcome"] == "found" and report["culprit"]["sha"] == shas[9]
    assert report["metric"] == "mean KLD against the good end (step 0.01)"
    assert report["effect_unit"] == "mean KLD" and report["effect"]["delta_pct"] > 0.01
    tried = {c["index"]: c for c in report["commits"]}
    assert tried[0]["samples"] == {"box": [0.0]}  # the good end against its own logits
    assert all(len(c["samples"]["box"]) == 1 for c in tried.values())  # each checked once
    assert tried[24]["samples"]["box"][0] > 0.01
    stored = quality_store(quality_tiny.settings.results).records()
    assert {r.stats.kld_mean > 0.01 for r in stored} == {True, False}
    step = bisect(kz, shas, plan, "kld:1000")  # no change is that large
    assert step.code == 0 and json.loads(step.out)["outcome"] == "no change"
