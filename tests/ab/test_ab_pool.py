"""kzbuild ab and bench --plan on a pool of local devices (real builds, deploys and llama-bench
runs): each plan run is one comparison, every variant of it interleaved on one device; a member
another kzbuild holds is left out."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kzbuild.measure.resultsdb import ResultsStore
from tests.ab.conftest import SPEED
from tests.fixtures_build import Tiny

TRAILERS = "\n\nUpstream-Status: Pending\nKz-Test: tests/ab/test_ab_pool.py"
RUN = "options: {p: 32, n: 0, t: 1}"


def hold(root: Path) -> None:
    """The device root's lock, as another machine's kzbuild that is benching holds it."""
    (root / ".lock").mkdir(parents=True)
    (root / ".lock" / "owner").write_text(
        "other-host\n4242\n2026-12-04T08:00:00Z\nbench\n0123456789abcdef\n"
    )


def pool(tiny: Tiny, tmp_path: Path) -> dict[str, Path]:
    """pad-a and pad-b free, pad-c held; a plan of three runs whose model every pad has."""
    roots = {name: tmp_path / name for name in ("pad-a", "pad-b", "pad-c")}
    for root in roots.values():
        (root / "models").mkdir(parents=True)
        (root / "models" / "q.gguf").write_bytes(b"GGUF stand-in")
    hold(roots["pad-c"])
    tiny.project.write(
        "recipes/devices.yaml",
        "devices:\n"
        + "".join(f"  {n}: {{transport: local, root: '{r}'}}\n" for n, r in roots.items())
        + "pools:\n  pads: [pad-a, pad-b, pad-c]\n",
    )
    write_plan(tiny)
    return roots


def write_plan(tiny: Tiny) -> str:
    """plans/pool.yaml: three runs of the tiny llama-bench, 3 blocks for ab; returns its path."""
    sha = hashlib.sha256(b"GGUF stand-in").hexdigest()
    path = tiny.project.write(
        "plans/pool.yaml",
        f"model: {{path: models/q.gguf, sha256: {sha}}}\nrepetitions: 1\nseed: 7\nruns:\n"
        + "".join(f"  - {{name: {name}, {RUN}}}\n" for name in ("first", "second", "third"))
        + "ab: {blocks: 3}\n",
    )
    return str(path)


def add_faster(tiny: Tiny) -> None:
    """A patch that makes ggml 20% faster, declaring +10% on pad-b."""
    tiny.add_patch(
        "faster.patch",
        {"ggml/src/ggml.c": SPEED.replace("100.0", "120.0")},
        "ggml: faster" + TRAILERS + "\nKz-Expect: pp32 +10% on pad-b",
    )


def test_ab_spreads_the_plan_runs_over_the_free_pads_each_run_on_one_device(
    kz, bench_tiny, tmp_path
):
    roots = pool(bench_tiny, tmp_path)
    add_faster(bench_tiny)
    plan = str(bench_tiny.project.root / "plans" / "pool.yaml")
    result = kz("ab", "tiny", "--plan", plan, "--device", "pads", "--json")
    assert result.code == 0, result.err
    assert "pad-c: busy (bench by other-host pid 4242" in result.err
    report = json.loads(result.out)
    assert report["device"] == "pad-a, pad-b"
    # dealt in turn, one device per run; a device's runs follow one another
    assert [(r["name"], r["device"]) for r in report["runs"]] == [
        ("first", "pad-a"),
        ("second", "pad-b"),
        ("third", "pad-a"),
    ]
    with ResultsStore(bench_tiny.project.root / "results") as store:
        for run in report["runs"]:
            stored = store.records(run["run_id"])
            assert len(stored) == 9  # 3 blocks x 3 variants
            assert {r.device.name for r in stored} == {run["device"]}
            assert {r.variant.name for r in stored if r.variant} == {
                "full",
                "minus:faster.patch",
                "upstream",
            }
    # an effect per device: pad-a's two runs (same configuration) against pad-b's one
    effects = {(e["variant"], e["device"]): e for e in report["effects"]}
    assert set(effects) == {
        (variant, device)
        for variant in ("minus:faster.patch", "upstream")
        for device in ("pad-a", "pad-b")
    }
    faster_a, faster_b = (
        effects["minus:faster.patch", "pad-a"],
        effects["minus:faster.patch", "pad-b"],
    )
    assert faster_a["effect"]["samples_a"] == 6 and faster_b["effect"]["samples_a"] == 3
    assert round(faster_b["effect"]["delta_pct"], 6) == 20.0
    (check,) = report["checks"]
    assert check["verdict"] == "confirmed"
    assert [e["device"] for e in check["effects"]] == ["pad-b"]
    builds = {v["build_id"] for v in report["variants"]}
    for name in ("pad-a", "pad-b"):  # both pads hold every variant; the busy one got nothing
        assert {p.name for p in (roots[name] / "releases").iterdir()} == builds
    assert not (roots["pad-c"] / "releases").exists()

    text = kz("ab", "tiny", "--plan", plan, "--device", "pads", "--markdown")
    assert text.code == 0, text.err
    assert "| faster.patch | pp32 on pad-a |" in text.out
    assert "| faster.patch | pp32 on pad-b |" in text.out


def test_bench_plan_spreads_its_runs_over_the_free_pads(kz, bench_tiny, tmp_path):
    roots = pool(bench_tiny, tmp_path)
    assert kz("build", "tiny").code == 0
    for root in (roots["pad-a"], roots["pad-b"]):
        assert kz("deploy", "tiny", "--device", f"local:{root}").code == 0
    plan = str(bench_tiny.project.root / "plans" / "pool.yaml")
    result = kz("bench", "--plan", plan, "--device", "pads", "--json")
    assert result.code == 0, result.err
    assert "pad-c: busy (bench by other-host pid 4242" in result.err
    report = json.loads(result.out)
    assert [(r["name"], r["device"]) for r in report["runs"]] == [
        ("first", "pad-a"),
        ("second", "pad-b"),
        ("third", "pad-a"),
    ]
    for run in report["runs"]:
        assert {r["device"]["name"] for r in run["records"]} == {run["device"]}
    assert not (roots["pad-a"] / ".lock").exists() and not (roots["pad-b"] / ".lock").exists()


@pytest.mark.slow  # two adb servers, two test devices, two variant builds: about 30 s
def test_ab_and_bench_plan_on_two_adb_devices_behind_two_adb_servers(kz, bench_tiny, adb_pool):
    root = "/data/local/tmp/kz-engine"
    adb_pool.put(root, "models/q.gguf", b"GGUF stand-in")
    bench_tiny.project.write("recipes/devices.yaml", adb_pool.devices_yaml(root))
    add_faster(bench_tiny)
    plan = write_plan(bench_tiny)
    result = kz("ab", "tiny", "--plan", plan, "--device", "pads", "--variant", "minus", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert [r["device"] for r in report["runs"]] == ["pad-a", "pad-b", "pad-a"]
    effects = {e["device"]: e for e in report["effects"]}
    assert set(effects) == {"pad-a", "pad-b"} and len(report["effects"]) == 2
    assert all(round(e["effect"]["delta_pct"], 6) == 20.0 for e in effects.values())
    assert report["checks"][0]["verdict"] == "confirmed"

    benched = kz("bench", "--plan", plan, "--device", "pads", "--json")
    assert benched.code == 0, benched.err
    runs = json.loads(benched.out)["runs"]
    assert [r["device"] for r in runs] == ["pad-a", "pad-b", "pad-a"]
    for run in runs:
        assert {r["device"]["name"] for r in run["records"]} == {run["device"]}
        assert {r["build"]["build_id"] for r in run["records"]} == {
            next(v["build_id"] for v in report["variants"] if v["spec"]["name"] == "full")
        }  # ab left each device's current release on the full stack
    # pad-b was reached through the other server
    assert adb_pool.second.serial in adb_pool.server.adb("devices").stdout
