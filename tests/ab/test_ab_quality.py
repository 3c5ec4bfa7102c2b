"""kzbuild ab checks each variant's output (tiny upstream, real builds, a local device): a patch
that
only changes speed keeps the output right; one that perturbs an op's output is wrong past max_kld,
whatever its speed, and ab exits 14. Quality records are stored with their provenance."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kzbuild.measure.quality import CORPORA, quality_store
from tests.ab.conftest import LOGIT, SPEED
from tests.ab.test_ab_tiny import TRAILERS
from tests.fixtures_build import Tiny


def stack(tiny: Tiny, device_root: Path) -> None:
    """faster: ggml +20%, the same logits; perturb: the same speed, logits moved as a kernel bug
    would."""
    tiny.add_patch(
        "faster.patch",
        {"ggml/src/ggml.c": SPEED.replace("100.0", "120.0") + LOGIT},
        "ggml: faster" + TRAILERS,
    )
    perturbed = LOGIT.replace("/ 4.0f;", "/ 4.0f + (float) ((pos * tok) % 5) * 0.6f;")
    tiny.add_patch(
        "perturb.patch",
        {"ggml/src/ggml.c": SPEED.replace("100.0", "120.0") + perturbed},
        "ggml: perturb" + TRAILERS,
        base=tiny.upstream.commit(
            {"ggml/src/ggml.c": SPEED.replace("100.0", "120.0") + LOGIT}, "faster, as a base"
        ),
    )
    tiny.project.write(
        "recipes/devices.yaml",
        f"devices:\n  bench-box:\n    transport: local\n    root: {device_root}\n",
    )
    (device_root / "models").mkdir(parents=True)
    (device_root / "models" / "q.gguf").write_bytes(b"GGUF stand-in")


def ab(kz, *args: str):  # type: ignore[no-untyped-def]
    return kz("ab", "tiny", "--device", "bench-box", "-m", "models/q.gguf", "--blocks", "1", *args)


def test_ab_reports_the_speed_patch_right_and_the_perturbing_patch_wrong_and_exits_14(
    kz, quality_tiny, tmp_path
):
    device_root = tmp_path / "device"
    stack(quality_tiny, device_root)
    (device_root / "lose-tail-once").write_text(
        ""
    )  # the first comparison's output loses its last lines
    result = ab(kz, "--seed", "3", "--max-kld", "0.01", "--min-top1", "90", "--json")
    assert result.code == 17, result.err
    assert "output stops before its statistics" in result.err and "running it again" in result.err
    (retried,) = (quality_tiny.project.work / "quality").glob("*/*.try2.log")
    assert "Same top p:" in retried.read_text() and not (device_root / "lose-tail-once").exists()
    report = json.loads(result.out)
    records = {r["variant"]: r for r in report["quality"]}
    assert set(records) == {"full", "minus:faster.patch", "minus:perturb.patch", "upstream"}
    assert (
        records["upstream"]["stats"]["kld_mean"] == 0
        and records["upstream"]["stats"]["top1_pct"] == 100
    )
    assert (
        records["minus:perturb.patch"]["stats"]["kld_mean"] == 0
        and records["minus:perturb.patch"]["verdict"] == "right"
    )
    full = records["full"]
    assert (
        full["verdict"] == "wrong"
        and full["stats"]["kld_mean"] > 0.01
        and full["stats"]["ppl_ratio"] != 1
    )
    assert full["problems"][0].startswith("mean KLD")
    patches = {p["patch"]: p for p in report["patch_quality"]}
    assert (
        patches["faster.patch"]["verdict"] == "right"
    )  # the stack without it is as wrong: it changes speed only
    assert (
        patches["perturb.patch"]["verdict"] == "wrong"
        and "right without it" in patches["perturb.patch"]["why"]
    )
    assert patches[None]["verdict"] == "wrong"  # the whole stack against upstream
    effects = {e["patch"]: e for e in report["effects"]}
    assert (
        round(effects["faster.patch"]["effect"]["delta_pct"], 6) == 20.0
    )  # the speed is still measured and shown
    # provenance: model and corpus sha256, the reference's build, the release's build
    corpus_sha = hashlib.sha256((CORPORA / "fr-atelier.txt").read_bytes()).hexdigest()
    assert full["corpus"] == {"name": "fr-atelier", "sha256": corpus_sha}
    assert full["model"]["sha256"] == hashlib.sha256(b"GGUF stand-in").hexdigest()
    builds = {v["spec"]["name"]: v["build_id"] for v in report["variants"]}
    assert full["reference"] == {
        "variant": "upstream",
        "build_id": builds["upstream"],
        "options": {"dev": "none", "ngl": "0"},
    }
    assert full["build"]["build_id"] == builds["full"]
    assert (
        "--kl-divergence" in full["argv"]
        and (device_root / "quality" / f"{corpus_sha}.txt").is_file()
    )
    assert not list(
        (device_root / "quality").glob("*.kld")
    )  # the reference logits are removed after the run
    stored = quality_store(quality_tiny.project.root / "results").records()
    assert {(r.variant, r.verdict) for r in stored} == {
        (name, r["verdict"]) for name, r in records.items()
    }

    # the table: beside each speed effect, the mean KLD without -> with the patch, and the verdict
    shown = ab(kz, "--seed", "4", "--variant", "minus:perturb.patch", "--max-kld", "0.01")
    assert shown.code == 17, shown.err
    text = " ".join(shown.out.split())
    assert (
        "WRONG" in text and "right" in text and "perturb.patch: the stack is wrong with it" in text
    )
    assert {r["variant"] for r in report["quality"]} <= {
        r.variant for r in quality_store(quality_tiny.project.root / "results").records()
    }

    md = ab(kz, "--seed", "5", "--variant", "minus:faster.patch", "--max-kld", "0.01", "--markdown")
    assert md.code == 17, md.err
    kld = f"{full['stats']['kld_mean']:.6f}"
    assert (
        f"| faster.patch | {kld} -> {kld} | right |" in md.out
    )  # speed only: the output is as wrong without it
    assert f"| full | {kld} |" in md.out and "| upstream | 0.000000 |" in md.out


def test_ab_without_a_limit_checks_no_output(kz, quality_tiny, tmp_path):
    device_root = tmp_path / "device"
    stack(quality_tiny, device_root)
    result = ab(kz, "--seed", "3", "--variant", "upstream", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["quality"] == []
    assert not (device_root / "quality").exists()


def test_a_tree_without_llama_perplexity_is_refused_before_anything_is_benched(
    kz, bench_tiny, tmp_path
):
    device_root = tmp_path / "device"
    bench_tiny.project.write(
        "recipes/devices.yaml",
        f"devices:\n  bench-box:\n    transport: local\n    root: {device_root}\n",
    )
    (device_root / "models").mkdir(parents=True)
    (device_root / "models" / "q.gguf").write_bytes(b"GGUF stand-in")
    result = ab(kz, "--seed", "1", "--max-kld", "0.01")
    assert result.code == 13, result.err
    assert "has no tools/perplexity/perplexity.cpp" in " ".join(result.err.split())
    assert not (
        bench_tiny.project.root / "results" / "results.jsonl"
    ).exists()  # nothing was benched
