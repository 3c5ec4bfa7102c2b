"""kzbuild bisect end to end: a tiny upstream of 64 commits (real git, sync, cmake/ninja/ccache
builds, deploys to a local device, interleaved llama-bench runs), one commit 10% slower."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.ab.conftest import SPEED
from tests.bench.benchkit import flat
from tests.bisect.conftest import bisect_args
from tests.fixtures_build import Tiny

SLOW_AT = 41  # of 1..63 after the pin
PLAN = """\
description: bisect test plan
model:
  path: models/q.gguf
  sha256: {sha}
repetitions: 1
seed: 3
runs:
  - name: prefill
    options: {p: 32, n: 0, t: 1}
"""


def history(tiny: Tiny, device_root, *, pr: bool = True) -> list[str]:
    """63 commits after the pin; commit SLOW_AT makes ggml 10% slower."""
    shas = [tiny.commit]
    for n in range(1, 64):
        files = {"docs/log.txt": f"change {n}\n"}
        subject = f"docs: change {n}"
        if n == SLOW_AT:
            files["ggml/src/ggml.c"] = SPEED.replace("100.0", "90.0")
            subject = "ggml: retune the scheduler" + (" (#4242)" if pr else "")
        shas.append(tiny.upstream.commit(files, subject))
    tiny.project.write(
        "recipes/devices.yaml", f"devices:\n  box:\n    transport: local\n    root: {device_root}\n"
    )
    (device_root / "models").mkdir(parents=True)
    (device_root / "models" / "q.gguf").write_bytes(b"GGUF stand-in")
    tiny.project.write(
        "plans/bisect.yaml", PLAN.replace("{sha}", hashlib.sha256(b"GGUF stand-in").hexdigest())
    )
    return shas


def test_bisect_names_the_slower_commit_in_at_most_8_builds_and_a_second_run_builds_nothing(
    kz, bench_tiny, tmp_path
):
    shas = history(bench_tiny, tmp_path / "device")
    plan = str(bench_tiny.project.root / "plans" / "bisect.yaml")
    args = bisect_args(shas, plan)
    result = kz(*args, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["outcome"] == "found" and report["culprit"]["sha"] == shas[SLOW_AT]
    assert report["pr"] == 4242 and report["culprit"]["subject"].startswith("ggml: retune")
    # the device is this host: nothing is built ahead (it would slow the measurements)
    assert "builds are not made ahead: box runs on this host" in flat(result.err)
    assert report["builds"] <= 8 and report["built_ahead_unused"] == 0, report["builds"]
    assert round(report["effect"]["delta_pct"]) == -10 and report["effect"]["high_pct"] < 0
    assert report["metric"] == "prefill:pp32 t/s"
    tried = {c["sha"]: c for c in report["commits"]}
    assert all(not c["bare"] and len(c["samples"]["box"]) >= 3 for c in tried.values())
    # checked and warned once per bisect (per release), not once per round or turn
    said = flat(result.err)
    assert said.count("cannot check llama.cpp's buffer size log format") == 1, said
    assert said.count("peak memory is not measured") == len(tried), said

    # the same bisect: its record answers, nothing is built or benched
    again = kz(*args, "--markdown")
    assert again.code == 0, again.err
    assert "0 built here, 0 interleaved rounds" in again.out
    assert f"first commit that moved prefill:pp32 t/s: {shas[SLOW_AT][:12]}" in " ".join(
        again.out.split()
    )
    assert "(PR #4242" in again.out


def test_a_commit_where_the_stack_does_not_apply_is_tested_bare_and_says_so(
    kz, bench_tiny, tmp_path
):
    shas = history(bench_tiny, tmp_path / "device")
    # a patch on the docs log as it was at the pin: from change 1 on it no longer applies
    bench_tiny.add_patch(
        "docs.patch", {"docs/log.txt": "documented\n"}, "docs: a line\n\nUpstream-Status: Pending"
    )
    plan = str(bench_tiny.project.root / "plans" / "bisect.yaml")
    result = kz(*bisect_args(shas, plan), "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["culprit"]["sha"] == shas[SLOW_AT]
    commits = {c["index"]: c for c in report["commits"]}
    assert (
        not commits[0]["bare"]
        and commits[63]["bare"]
        and "docs.patch" in commits[63]["stack_problem"]
    )


def test_a_range_that_is_not_a_history_is_refused(kz, bench_tiny, tmp_path):
    shas = history(bench_tiny, tmp_path / "device")
    plan = str(bench_tiny.project.root / "plans" / "bisect.yaml")
    result = kz(
        "bisect", "tiny", "--good", shas[10], "--bad", shas[3], "--plan", plan, "--device", "box"
    )
    assert result.code == 2 and "is not an ancestor of" in result.err
    unknown = kz(*bisect_args(shas[:4], plan), "--metric", "decode")
    assert unknown.code == 2 and "the plan has no run 'decode'" in unknown.err


@pytest.mark.slow  # two adb servers, two test devices, ~10 builds: about 45 s
def test_a_pool_of_two_adb_devices_on_two_adb_servers_finds_it_each_comparison_on_one_device(
    kz, bench_tiny, tmp_path, adb_pool
):
    shas = history(bench_tiny, tmp_path / "unused")
    root = "/data/local/tmp/kz-engine"
    adb_pool.put(root, "models/q.gguf", b"GGUF stand-in")
    bench_tiny.project.write("recipes/devices.yaml", adb_pool.devices_yaml(root))
    listed = kz("device", "list", "--json")
    assert listed.code == 0, listed.err
    states = {d["name"]: (d["state"], d["pools"]) for d in json.loads(listed.out)["devices"]}
    assert states["pad-a"] == states["pad-b"] == ("free", ["pads"])
    plan = str(bench_tiny.project.root / "plans" / "bisect.yaml")
    result = kz(*bisect_args(shas, plan, "pads"), "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["culprit"]["sha"] == shas[SLOW_AT]
    used = {step["note"] for step in report["steps"]}
    assert used == {"on pad-a", "on pad-b"}
    for step in report[
        "steps"
    ]:  # the mid and both ends have samples from the device that compared them
        device = step["note"].removeprefix("on ")
        commits = {c["index"]: c for c in report["commits"]}
        assert all(commits[i]["samples"].get(device) for i in (step["lo"], step["mid"], step["hi"]))
    # pad-b was reached through the other server
    assert adb_pool.second.serial in adb_pool.server.adb("devices").stdout
