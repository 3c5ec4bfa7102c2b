"""Slow tier: the real llama.cpp host build runs a model cut into GGUF splits (every tensor in a
split of its own, and as ``kzbuild models push --split`` stores it) exactly as the original: the
same generated tokens, the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kzbuild.device import ggufsplit
from kzbuild.measure.tinymodel import write_tiny_model
from kzbuild.model.build import BuildResult
from tests.fixtures_build import run_from_artifact

pytestmark = pytest.mark.slow

PROMPT = ("-no-cnv", "-n", "24", "-p", "hi", "-t", "1", "--temp", "0", "--seed", "1")


def generated(run) -> str:
    """The text a greedy llama-completion run prints (retried: upstream's log thread can lose the
    end of a short run's output, see test_tinymodel_llama_cpp.py)."""
    for _ in range(5):
        result = run()
        assert result.returncode == 0, result.stderr[-2000:]
        if "prompt eval time" in result.stderr:
            return str(result.stdout)
    raise AssertionError("5 runs of llama-completion, none with its full log")


def kld_base_args(model: str, text: Path, out: Path) -> list[str]:
    """llama-perplexity writing its KL-divergence base file for ``text`` to ``out``."""
    return [
        "llama-perplexity",
        *("-m", model, "-f", str(text), "-c", "128", "-b", "128", "-t", "1"),
        *("--kl-divergence-base", str(out)),
    ]


def logits(real_host_build: BuildResult, model: Path, text: Path, out: Path) -> bytes:
    """llama-perplexity's KL-divergence base file: the tokens and every position's logits."""
    result = run_from_artifact(real_host_build.artifact, *kld_base_args(str(model), text, out))
    assert result.returncode == 0, result.stderr[-2000:]
    return out.read_bytes()


def test_a_split_model_gives_the_original_s_tokens_and_logits(
    kz, real_host_build: BuildResult, tmp_path: Path
):
    artifact = real_host_build.artifact
    model = write_tiny_model(tmp_path / "tiny.gguf", arch="qwen35", ftype="q4_0")
    folder = tmp_path / "split"
    folder.mkdir()
    splits = ggufsplit.plan(model, elements=0)
    paths = ggufsplit.write_splits(model, splits, folder, "tiny")
    assert len(paths) > 40  # the metadata, then every tensor on its own

    def complete(path: Path):
        return lambda: run_from_artifact(artifact, "llama-completion", "-m", str(path), *PROMPT)

    original = generated(complete(model))
    assert original.startswith(" hi") and len(original) > 4
    assert generated(complete(paths[0])) == original
    text = tmp_path / "text.txt"
    text.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 60))
    base = logits(real_host_build, model, text, tmp_path / "original.kld")
    assert len(base) > 100_000
    assert logits(real_host_build, paths[0], text, tmp_path / "split.kld") == base

    # llama.cpp really reads the other splits: without one of them the model does not load
    paths[7].rename(tmp_path / "aside.gguf")
    assert complete(paths[0])().returncode != 0  # (its message can be lost with the log thread)
    (tmp_path / "aside.gguf").rename(paths[7])

    # as models push --split stores it on a device, through kzbuild run
    root = tmp_path / "device"
    deployed = kz("deploy", "--device", f"local:{root}", "--artifact", str(artifact.path))
    assert deployed.code == 0, deployed.err
    pushed = kz("models", "push", str(model), "--device", f"local:{root}", "--split", "--json")
    assert pushed.code == 0, pushed.err
    sha = json.loads(pushed.out)["sha256"]
    assert (root / "models" / f"{sha}-00001-of-00002.gguf").exists()

    # kzbuild run gives llama.cpp the first split's path for the model's name (the logits file,
    # not the tool's output: a tiny model's random text is no UTF-8 for the test's capture)
    ran = kz(
        "run",
        "--device",
        f"local:{root}",
        *kld_base_args("models/tiny.gguf", text, tmp_path / "device.kld"),
    )
    assert ran.code == 0, ran.err[-2000:]
    assert (tmp_path / "device.kld").read_bytes() == base

    # kzbuild bench too: llama-bench opens the first split, the record names the pushed sha256
    benched = kz(
        "bench",
        "--device",
        f"local:{root}",
        "-m",
        "models/tiny.gguf",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "1",
        "--json",
    )
    assert benched.code == 0, benched.err[-2000:]
    records = json.loads(benched.out)["records"]
    assert {r["test"] for r in records} == {"pp16", "tg4"}
    for record in records:
        assert record["model"]["sha256"] == sha and record["model"]["path"] == "models/tiny.gguf"
        assert f"{root}/models/{sha}-00001-of-00002.gguf" in record["argv"]
