"""The quality check, slow tier: the real llama-perplexity of the pinned host build, deployed to a
local
device, records reference logits of the tiny qwen35 over the shipped French corpus and compares a
run
against them; its statistics are read by the parser, whose formats are checked against the really
synced tree (and a copy with a format changed is refused). Kept fast: -c 128, 2 chunks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kzbuild.device.local import LocalTransport
from kzbuild.device.registry import local_device
from kzbuild.errors import OutputFormatChanged
from kzbuild.measure.quality import (
    PERPLEXITY_CPP,
    check_tree_formats,
    check_variants,
    check_worktree_formats,
    quality_store,
)
from kzbuild.measure.tinymodel import write_tiny_model
from kzbuild.model.build import BuildResult
from kzbuild.model.quality import CPU_ONLY, QualityLimits, QualitySpec
from tests.conftest import git, persistent_test_cache

pytestmark = pytest.mark.slow


def test_real_llama_perplexity_over_the_french_corpus_keeps_the_same_build_right(
    kz, project, real_host_build: BuildResult, tmp_path: Path
):
    artifact = real_host_build.artifact
    assert "llama-perplexity" in artifact.tools
    worktree = (
        persistent_test_cache() / "kz-work" / "src" / "demo-host"
    )  # where real_host_build synced the pin
    check_worktree_formats(worktree)
    source = git(worktree, "show", f"HEAD:{PERPLEXITY_CPP}")
    with pytest.raises(OutputFormatChanged, match="Same top p"):
        check_tree_formats(
            source.replace('"Same top p: %6.3lf', '"Same top-1: %6.3lf'), "changed perplexity.cpp"
        )

    root = tmp_path / "device"
    deployed = kz("deploy", "--device", f"local:{root}", "--artifact", str(artifact.path), "--json")
    assert deployed.code == 0, deployed.err
    release = json.loads(deployed.out)["release"]
    model = write_tiny_model(tmp_path / "tiny-qwen35.gguf", arch="qwen35", ftype="q4_0")
    assert kz("models", "push", str(model), "--device", f"local:{root}").code == 0

    device = local_device(project.settings, str(root))
    store = quality_store(tmp_path / "results")
    limits = QualityLimits(max_kld=0.001, min_top1=99)
    same = QualitySpec(
        limits=limits,
        context=128,
        chunks=2,
        options=(("t", "2"),),
        reference_options=(*CPU_ONLY, ("t", "2")),
    )
    records = check_variants(
        LocalTransport(str(root)),
        device,
        {"upstream": release, "full": release},
        same,
        "models/tiny-qwen35.gguf",
        store,
        tmp_path / "logs",
    )
    for record in records:
        stats = record.stats
        assert abs(stats.kld_mean) < 1e-4 and stats.kld_max < 1e-3 and stats.top1_pct == 100, stats
        assert math.isclose(stats.ppl_ratio, 1, abs_tol=1e-3) and stats.ppl > 1
        assert (
            record.verdict == "right"
            and record.corpus.name == "fr-atelier"
            and len(record.model.sha256 or "") == 64
        )
        assert (
            record.reference.build_id == artifact.build_id
            and record.build.build_id == artifact.build_id
        )
    assert [r.variant for r in store.records()] == ["upstream", "full"]
    assert not list((root / "quality").glob("*.kld"))
