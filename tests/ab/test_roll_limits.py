"""kzbuild roll --device exits as kzbuild ab does when the candidate is past the plan's limits: 15
over its memory_budget (kz-peakrss's real peak), 17 when its output is wrong past max_kld. The tiny
upstream of the ab tests (a git source, so roll finds the candidate), real builds, a local
device."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.ab.conftest import LOGIT, SPEED, STAND_IN, STAND_IN_PLAN
from tests.conftest import REPO_ROOT
from tests.fixtures_build import Tiny
from tests.fixtures_stack import file_source

PLAN = STAND_IN_PLAN + "seed: 5\nab:\n  blocks: 1\n"


def rollable(tiny: Tiny, device_root: Path) -> None:
    """The recipe from a git source (roll looks for candidates there), built with kz-peakrss."""
    recipe = tiny.project.root / "recipes" / "tiny.yaml"
    recipe.write_text(
        recipe.read_text()
        .replace(f"path: {tiny.upstream.path}", file_source(tiny.upstream))
        .replace("llama-perplexity]", "llama-perplexity, kz-peakrss]")
    )
    peakrss = Path("kernels") / "peakrss"
    shutil.copytree(REPO_ROOT / peakrss, tiny.project.root / peakrss)
    (device_root / "models").mkdir(parents=True)
    (device_root / "models" / "q.gguf").write_bytes(STAND_IN)


def roll(kz, tiny: Tiny, device_root: Path, plan: str):  # type: ignore[no-untyped-def]
    path = tiny.project.write("plans/roll.yaml", plan)
    return kz(
        "roll",
        "tiny",
        "--plan-target",
        "none",
        "--device",
        f"local:{device_root}",
        "--plan",
        str(path),
        "--threshold",
        "50",
        "--json",
    )


def test_roll_device_exits_15_over_the_memory_budget_and_17_for_a_wrong_candidate(
    kz, quality_tiny, tmp_path
):
    device_root = tmp_path / "device"
    rollable(quality_tiny, device_root)
    quality_tiny.upstream.commit({"docs/log.txt": "a newer upstream\n"}, "docs: newer (#1)")

    over = roll(kz, quality_tiny, device_root, PLAN + "memory_budget: 1KiB\n")
    assert over.code == 15, over.out + over.err
    assert "past the plan's memory limits" in over.err
    (candidate,) = json.loads(over.out)["candidates"]
    assert candidate["outcome"] == "over memory budget"
    assert candidate["bench"]["memory_over"] == ["memory_budget"]
    assert candidate["steps"][-1]["status"] == "fail"

    within = roll(kz, quality_tiny, device_root, PLAN + "memory_budget: 4GiB\n")
    assert within.code == 0, within.err
    (candidate,) = json.loads(within.out)["candidates"]
    assert candidate["outcome"] == "rollable" and candidate["bench"]["memory_over"] == []

    perturbed = LOGIT.replace("/ 4.0f;", "/ 4.0f + (float) ((pos * tok) % 5) * 0.6f;")
    quality_tiny.upstream.commit({"ggml/src/ggml.c": SPEED + perturbed}, "ggml: perturb (#2)")
    wrong = roll(kz, quality_tiny, device_root, PLAN + "quality:\n  max_kld: 0.01\n")
    assert wrong.code == 17, wrong.err
    (candidate,) = json.loads(wrong.out)["candidates"]
    assert candidate["outcome"] == "wrong output" and candidate["bench"]["wrong"] is True
    records = {r["variant"]: r for r in candidate["bench"]["quality"]}
    assert records["pin"]["verdict"] == "right" and records["candidate"]["verdict"] == "wrong"
