"""Slow tier: the real host artifact of the pin (the session's ``real_host_build``, built or
reused through kzbuild build), deployed with kzbuild deploy and a tiny model pushed with kzbuild
models push, run through kzbuild run and bench (local, adb and ssh); and GGML_HEXAGON_* names
scanned from the really synced pinned tree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kzbuild.adapters.settings import Settings
from kzbuild.cli import main
from kzbuild.device.registry import parse_device_spec
from kzbuild.device.run import hexagon_env_names
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.tinymodel import write_tiny_model
from kzbuild.model.build import BuildResult
from tests.adbdevice import AdbTestDevice
from tests.bench.benchkit import flat
from tests.fixtures_build import real_project
from tests.fixtures_deploy import sha256

pytestmark = pytest.mark.slow


@dataclass
class Deployed:
    spec: str  # the --device argument
    release: str  # the release dir on the device
    build_id: str
    manifest_sha256: str
    model_sha256: str


def deploy_real_llama_bench(kz, spec: str, build: BuildResult, work: Path) -> Deployed:  # type: ignore[no-untyped-def]
    """Deploy the real host artifact with kzbuild deploy; push a tiny model with kzbuild models
    push."""
    model = write_tiny_model(work / "tiny-llama.gguf", arch="llama", ftype="f32")
    deployed = kz("deploy", "--device", spec, "--artifact", str(build.artifact.path), "--json")
    assert deployed.code == 0, deployed.err
    pushed = kz("models", "push", str(model), "--device", spec)
    assert pushed.code == 0, pushed.err
    device = parse_device_spec(spec)
    assert device is not None
    release = json.loads(deployed.out)["release"]
    return Deployed(
        spec,
        f"{device.root}/releases/{release}",
        build.artifact.build_id,
        sha256(build.artifact.manifest_path),
        sha256(model),
    )


@pytest.fixture
def real_release(kz, real_host_build: BuildResult, tmp_path: Path) -> Deployed:
    return deploy_real_llama_bench(kz, f"local:{tmp_path / 'device'}", real_host_build, tmp_path)


def test_bench_runs_the_real_llama_bench_and_stores_its_samples(kz, project, real_release):
    result = kz(
        "bench",
        "--device",
        real_release.spec,
        "-m",
        "models/tiny-llama.gguf",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
        "--sweep",
        "ub=8,16",
        "--seed",
        "3",
        "--json",
    )
    assert result.code == 0, result.err
    out = json.loads(result.out)
    records = out["records"]
    assert sorted((r["test"], r["config"]["n_ubatch"]) for r in records) == [
        ("pp16", 8),
        ("pp16", 16),
        ("tg4", 8),
        ("tg4", 16),
    ]
    for record in records:
        assert len(record["samples_ts"]) == 2 and all(s > 0 for s in record["samples_ts"])
        assert record["raw"]["build_commit"] and record["raw"]["backends"]
        bin_dir = f"{real_release.release}/bin"
        assert record["argv"][:2] == [f"{bin_dir}/kz-peakrss", f"{bin_dir}/llama-bench"]
        assert record["memory"]["peak_rss_kib"] > 0
        assert (
            record["build"]["build_id"] == real_release.build_id
            and record["build"]["recipe"] == "demo-host"
        )
        assert record["build"]["manifest_sha256"] == real_release.manifest_sha256
        assert record["model"]["sha256"] == real_release.model_sha256
    with ResultsStore(project.root / "results") as store:
        assert len(store.records(out["run_id"])) == 4
    shown = kz("results", "show", out["run_id"], "--markdown")
    assert shown.code == 0 and "| pp16 |" in shown.out


def test_run_streams_the_real_tool_and_returns_its_exit_code(kz, real_release):
    ok = kz(
        "run",
        "--device",
        real_release.spec,
        "--",
        "llama-bench",
        "-m",
        "models/tiny-llama.gguf",
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "-t",
        "1",
        "-o",
        "jsonl",
    )
    assert ok.code == 0, ok.err
    assert json.loads(ok.out.splitlines()[0])["n_prompt"] == 8
    bad = kz("run", "--device", real_release.spec, "--", "llama-bench", "--no-such-option")
    assert bad.code == 1
    assert "error: invalid parameter for argument: --no-such-option" in flat(bad.err)


def test_bench_over_adb_runs_the_real_llama_bench(
    kz, adb_device: AdbTestDevice, real_host_build, tmp_path
):
    deployed = deploy_real_llama_bench(
        kz, f"adb:{adb_device.serial}:/data/local/tmp/kz-engine", real_host_build, tmp_path
    )
    result = kz(
        "bench",
        "--device",
        deployed.spec,
        "-m",
        "models/tiny-llama.gguf",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
        "--json",
    )
    assert result.code == 0, result.err
    records = json.loads(result.out)["records"]
    assert [r["test"] for r in records] == ["pp16", "tg4"]
    assert all(len(r["samples_ts"]) == 2 for r in records)
    assert records[0]["device"]["fingerprint"]["android.soc_model"] == "SM8750"
    assert records[0]["model"]["sha256"] == deployed.model_sha256
    assert records[0]["build"]["manifest_sha256"] == deployed.manifest_sha256


def test_bench_over_ssh_runs_the_real_llama_bench(
    kz, project, sshd, ssh_home, real_host_build, tmp_path
):
    deployed = deploy_real_llama_bench(
        kz, sshd.spec(tmp_path / "device"), real_host_build, tmp_path
    )
    result = kz(
        "bench",
        "--device",
        deployed.spec,
        "-m",
        "models/tiny-llama.gguf",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
        "--json",
    )
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert [r["test"] for r in out["records"]] == ["pp16", "tg4"]
    assert out["records"][0]["model"]["sha256"] == deployed.model_sha256
    with ResultsStore(project.root / "results") as store:
        assert len(store.records(out["run_id"])) == 2


# At the pin 0c1e57098 ggml-hexagon reads these (facts sheet section 4); OPSYNC/OPMASK are gone.
HEXAGON_ENV_AT_PIN = {
    f"GGML_HEXAGON_{name}"
    for name in "DEVICES NDEV ARCH NHVX NHMX HOSTBUF DMA64 VERBOSE PROFILE OPTRACE ETM OPBATCH "
    "OPQUEUE OPPOLL "
    "OPFUSION OPFILTER MM_SELECT FA_SELECT GDN_SELECT AR_SELECT AR_SCATTER VMEM MBUF".split()
}


def test_env_names_come_from_the_real_pinned_tree(tmp_path):
    """Sync demo-host from the PyPI sdist (cached per machine), then scan its ggml-hexagon."""
    project = real_project(tmp_path)
    root, cache, work = project.root, project.cache, project.work
    assert (
        main(
            [
                "--project",
                str(root),
                "--cache-dir",
                str(cache),
                "--work-dir",
                str(work),
                "sync",
                "demo-host",
            ]
        )
        == 0
    )
    assert (
        hexagon_env_names(Settings(project=root, cache=cache, work=work), "demo-host")
        == HEXAGON_ENV_AT_PIN
    )
