"""Experiment plans: the shipped one, errors naming file, line and key, and kzbuild bench --plan on
a device."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from kzbuild.errors import ConfigError
from kzbuild.measure.bench import MAX_POINTS
from kzbuild.measure.plans import load_plan
from tests.bench.benchkit import REPLAY_LLAMA_BENCH, make_device_root
from tests.conftest import REPO_ROOT

SHIPPED = REPO_ROOT / "plans" / "gdn-prefill-pad3.yaml"
GOOD = """\
description: test plan
model:
  path: models/q.gguf
  sha256: {sha}
repetitions: 2
seed: 7
env: {{KZ_T_ALL: "1"}}
runs:
  - name: prefill
    options: {{p: 32, n: 0, t: 1}}
    sweep:
      env:GGML_HEXAGON_GDN_SELECT: [1, 2]
  - name: decode
    options: {{p: 0, n: 8}}
    env: {{KZ_T_RUN: decode}}
ab:
  variants: [upstream]
  blocks: 3
  cool_to: 44.5C
"""


def test_the_shipped_plan_is_the_gdn_prefill_experiment_on_pad3():
    plan = load_plan(SHIPPED)
    assert plan.device == "pad3" and plan.model.path == "models/qwen3.5-4b-q4_0.gguf"
    runs = {run.name: run.spec for run in plan.runs}
    htp, cpu, decode = runs["htp-prefill"], runs["cpu-prefill"], runs["cpu-decode"]
    assert dict(htp.options) == {
        "p": "128,512,2048",
        "n": "0",
        "dev": "HTP0",
        "ngl": "99",
        "t": "8",
        "b": "512",
        "r": "5",
    }
    assert {a.name: a.values for a in htp.sweep} == {
        "env:GGML_HEXAGON_GDN_SELECT": ("0", "1", "2"),
        "ub": ("128", "256", "512"),
    }
    assert dict(cpu.options)["dev"] == "none" and {a.name: a.values for a in cpu.sweep} == {
        "t": ("6", "8")
    }
    assert (
        dict(decode.options)["n"] == "64"
        and dict(decode.options)["dev"] == "none"
        and {a.name: a.values for a in decode.sweep} == {"t": ("6", "8")}
    )
    assert plan.ab.blocks == 5 and plan.ab.cool_to == 45.0
    # the env names are the pin's: GGML_HEXAGON_GDN_SELECT is read by ggml-hexagon at
    # 0c1e57098 (upstream-facts.md; the slow tier scans the tree)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "  sha256: " + "a" * 64,
            "  sha256: abc",
            "plan.yaml:4: sha256: must be 64 lowercase hex digits",
        ),
        (
            "  path: models/q.gguf",
            "  path: models/q.gguf\n  name: q.gguf",
            "plan.yaml:2: model: give the model's path on the device or the name",
        ),
        (
            "repetitions: 2",
            "repetitions: 0",
            "plan.yaml:5: repetitions: must be a whole number from 1",
        ),
        ("seed: 7", "seeds: 7", "plan.yaml:6: seeds: unknown key in plan"),
        (
            "    options: {p: 32, n: 0, t: 1}",
            "    options: {p: 32, n: 0, threads: 1}",
            "plan.yaml:10: threads: unknown llama-bench option 'threads'",
        ),
        (
            "    options: {p: 32, n: 0, t: 1}",
            "    options: {p: 32, n: 0, t: 0}",
            "plan.yaml:10: t: -t '0' must be at least 1",
        ),
        (
            "      env:GGML_HEXAGON_GDN_SELECT: [1, 2]",
            "      env:GGML_HEXAGON_GDN_SELECT: [1, 1]",
            "plan.yaml:12: env:GGML_HEXAGON_GDN_SELECT: sweep 'env:GGML_HEXAGON_GDN_SELECT=1,1': "
            "values must be non-empty and distinct",
        ),
        (
            "      env:GGML_HEXAGON_GDN_SELECT: [1, 2]",
            "      t: [1, 2]",
            "t is both swept and fixed",
        ),
        (
            "      env:GGML_HEXAGON_GDN_SELECT: [1, 2]",
            "      env:GGML_HEXAGON_GDN_SELECT: 2",
            "plan.yaml:12: env:GGML_HEXAGON_GDN_SELECT: must be a non-empty list",
        ),
        (
            "    env: {KZ_T_RUN: decode}",
            "    env: {1BAD: decode}",
            "plan.yaml:15: 1BAD: invalid environment variable name",
        ),
        (
            "  - name: decode",
            "  - name: prefill",
            "plan.yaml:13: name: run name 'prefill' is used twice",
        ),
        (
            "  cool_to: 44.5C",
            "  cool_to: warm",
            "plan.yaml:19: cool_to: cool_to 'warm' is not a temperature",
        ),
        ("  blocks: 3", "  blocks: many", "plan.yaml:18: blocks: must be a whole number"),
        ("runs:", "runz:", "plan.yaml:8: runz: unknown key in plan"),
    ],
)
def test_bad_plans_name_the_file_line_and_key(tmp_path, old, new, said):
    text = GOOD.format(sha="a" * 64).replace(old, new)
    with pytest.raises(ConfigError) as caught:
        load_plan(write(tmp_path, text))
    assert said in str(caught.value), str(caught.value)
    assert str(caught.value).startswith(str(tmp_path / "plan.yaml"))


def device_with_model(tmp_path: Path) -> tuple[Path, str]:
    device = make_device_root(
        tmp_path / "device", manifest={"build_id": "b-plan", "recipe": "demo-host"}
    )
    device.add_tool("llama-bench", REPLAY_LLAMA_BENCH)
    device.add_file("models/q.gguf", b"plan model")
    return device.root, hashlib.sha256(b"plan model").hexdigest()


def test_bench_plan_runs_every_run_of_the_plan(kz, tmp_path):
    root, sha = device_with_model(tmp_path)
    result = kz(
        "bench",
        "--plan",
        str(write(tmp_path, GOOD.format(sha=sha))),
        "--device",
        f"local:{root}",
        "--json",
    )
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert [run["name"] for run in out["runs"]] == ["prefill", "decode"]
    received = [json.loads(line) for line in (root / "received.jsonl").read_text().splitlines()]
    assert len(received) == 3  # two sweep points, then decode
    assert sorted(r["env"]["GGML_HEXAGON_GDN_SELECT"] for r in received[:2]) == ["1", "2"]
    assert (
        received[0]["argv"][received[0]["argv"].index("-t") + 1] == "1"
        and received[0]["argv"][received[0]["argv"].index("-r") + 1] == "2"
    )
    assert received[2]["argv"][received[2]["argv"].index("-n") + 1] == "8"
    first = out["runs"][0]["records"][0]
    assert (
        first["env"]["KZ_T_ALL"] == "1"
        and first["model"]["sha256"] == sha
        and first["sweep"]["seed"] == 7
    )
    assert out["runs"][1]["records"][0]["env"]["KZ_T_RUN"] == "decode"


def test_a_model_that_is_not_the_plans_file_is_refused_naming_the_plan_line(kz, tmp_path):
    root, _ = device_with_model(tmp_path)
    result = kz(
        "bench",
        "--plan",
        str(write(tmp_path, GOOD.format(sha="b" * 64))),
        "--device",
        f"local:{root}",
    )
    assert result.code == 2
    said = " ".join(result.err.split())
    assert (
        f"plan.yaml:4: sha256: local:{root}: models/q.gguf has sha256" in said
        and f"not the plan's {'b' * 64}" in said
    )
    assert not (root / "received.jsonl").exists()


def test_an_unpinned_model_runs_with_a_warning_naming_the_hash_to_pin(kz, tmp_path):
    root, sha = device_with_model(tmp_path)
    result = kz(
        "bench",
        "--plan",
        str(write(tmp_path, GOOD.format(sha="null"))),
        "--device",
        f"local:{root}",
    )
    assert result.code == 0, result.err
    unwrapped = "".join(result.err.split())  # rich wraps log lines anywhere
    assert (
        f"holds{sha}(putitintheplan'smodel.sha256)" in unwrapped
        and "theplanpinsnosha256" in unwrapped
    )


def test_bench_options_beside_a_plan_are_refused(kz, tmp_path):
    result = kz(
        "bench",
        "--plan",
        str(write(tmp_path, GOOD.format(sha="a" * 64))),
        "-t",
        "4",
        "--device",
        "local:/nowhere",
    )
    assert result.code == 2 and "-t cannot be given with it" in result.err


def test_a_sweep_of_a_trillion_points_is_refused_at_validation_with_its_count(tmp_path):
    values = "[" + ", ".join(str(v) for v in range(1, 1001)) + "]"
    axes = "".join(f"      {axis}: {values}\n" for axis in ("p", "b", "ub", "env:A"))
    text = (
        GOOD.format(sha="a" * 64)
        .replace("    sweep:\n      env:GGML_HEXAGON_GDN_SELECT: [1, 2]\n", f"    sweep:\n{axes}")
        .replace("options: {p: 32, n: 0, t: 1}", "options: {n: 0, t: 1}")
    )
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        load_plan(write(tmp_path, text))
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "plan.yaml:11: sweep: the sweep expands to 1000000000000 points" in message, message
    assert f"more than the {MAX_POINTS}" in message


def test_a_sweep_at_the_limit_is_accepted(tmp_path):
    values = "[" + ", ".join(str(v) for v in range(1, 65)) + "]"
    axes = "".join(f"      {axis}: {values}\n" for axis in ("p", "b"))  # 64 x 64 = MAX_POINTS
    text = (
        GOOD.format(sha="a" * 64)
        .replace("    sweep:\n      env:GGML_HEXAGON_GDN_SELECT: [1, 2]\n", f"    sweep:\n{axes}")
        .replace("options: {p: 32, n: 0, t: 1}", "options: {n: 0, t: 1}")
    )
    plan = load_plan(write(tmp_path, text))
    assert len(plan.runs[0].spec.sweep) == 2 and MAX_POINTS == 64 * 64
