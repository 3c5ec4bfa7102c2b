"""kzbuild ab end to end on a tiny upstream (real git, sync, cmake/ninja/ccache builds, deploys to a
local device):
variants, build ids, interleaved runs, the report, Kz-Expect and exit 9."""

from __future__ import annotations

import json
from pathlib import Path

from kzbuild.measure.resultsdb import ResultsStore
from tests.ab.conftest import SPEED
from tests.fixtures_build import Tiny

TRAILERS = "\n\nUpstream-Status: Pending\nKz-Test: tests/ab/test_ab_tiny.py"


def stack(tiny: Tiny, device_root: Path) -> None:
    """faster: ggml +20%; slower: the tool -10% though it declares +5%; docs: no effect, declares
    none."""
    tiny.add_patch(
        "faster.patch",
        {"ggml/src/ggml.c": SPEED.replace("100.0", "120.0")},
        "ggml: faster" + TRAILERS + "\nKz-Expect: pp32 +10% on bench-box",
    )
    main = (tiny.upstream.path / "tools" / "main.c").read_text()
    tiny.add_patch(
        "slower.patch",
        {
            "tools/main.c": main.replace(
                "double s = ggml_speed();", "double s = ggml_speed() * 0.9;"
            )
        },
        "tools: slower" + TRAILERS + "\nKz-Expect: pp32 +5% on bench-box",
    )
    tiny.add_patch(
        "docs.patch",
        {"README.md": "llama.cpp (synthetic), documented\n"},
        "docs: a line" + TRAILERS,
    )
    tiny.project.write(
        "recipes/devices.yaml",
        f"devices:\n  bench-box:\n    transport: local\n    root: {device_root}\n",
    )
    (device_root / "models").mkdir(parents=True)
    (device_root / "models" / "q.gguf").write_bytes(b"GGUF stand-in")


def test_ab_measures_each_patch_and_exits_9_when_a_declared_effect_is_contradicted(
    kz, bench_tiny, tmp_path
):
    device_root = tmp_path / "device"
    stack(bench_tiny, device_root)
    result = kz(
        "ab",
        "tiny",
        "--device",
        "bench-box",
        "-m",
        "models/q.gguf",
        "--blocks",
        "3",
        "--seed",
        "5",
        "--json",
    )
    assert result.code == 9, result.err
    assert "slower.patch: Kz-Expect pp32 +5% on bench-box: contradicted" in " ".join(
        result.err.split()
    )
    report = json.loads(result.out)
    variants = {v["spec"]["name"]: v for v in report["variants"]}
    assert list(variants) == [
        "full",
        "minus:faster.patch",
        "minus:slower.patch",
        "minus:docs.patch",
        "upstream",
    ]
    assert variants["minus:slower.patch"]["spec"]["patches"] == ["faster.patch", "docs.patch"]
    ids = {name: v["build_id"] for name, v in variants.items()}
    assert len(set(ids.values())) == 5  # every variant's sources differ
    effects = {(e["patch"], e["test"]): e for e in report["effects"]}
    faster, slower, docs, whole = (
        effects[(p, "pp32")] for p in ("faster.patch", "slower.patch", "docs.patch", None)
    )
    assert round(faster["effect"]["delta_pct"], 6) == 20.0 and faster["effect"]["low_pct"] > 0
    assert faster["full_median"] == 108.0 and faster["variant_median"] == 90.0
    assert round(slower["effect"]["delta_pct"], 6) == -10.0 and slower["effect"]["high_pct"] < 0
    assert (
        docs["effect"]["delta_pct"] == 0 == docs["effect"]["low_pct"] == docs["effect"]["high_pct"]
    )  # the same speed: no detectable effect
    assert round(whole["effect"]["delta_pct"], 6) == 8.0 and whole["variant"] == "upstream"
    assert faster["effect"]["samples_a"] == faster["effect"]["samples_b"] == 3  # one per block
    verdicts = {c["expectation"]["patch"]: c["verdict"] for c in report["checks"]}
    assert verdicts == {"faster.patch": "confirmed", "slower.patch": "contradicted"}
    (run,) = report["runs"]
    assert len(run["order"]) == 3 and all(
        sorted(block) == sorted(variants) for block in run["order"]
    )
    with ResultsStore(bench_tiny.project.root / "results") as store:
        stored = store.records(run["run_id"])
    assert len(stored) == 15 and {r.variant.name for r in stored if r.variant} == set(variants)
    assert {r.build.build_id for r in stored if r.variant and r.variant.name == "full"} == {
        ids["full"]
    }
    assert (device_root / "current").readlink() == Path("releases") / variants["full"][
        "release"
    ]  # left on the full stack

    # the full stack is the recipe's own build; a second ab builds and sends nothing
    built = kz("build", "tiny", "--json")
    assert built.code == 0, built.err
    assert json.loads(built.out)["build_id"] == ids["full"]
    again = kz(
        "ab",
        "tiny",
        "--device",
        "bench-box",
        "-m",
        "models/q.gguf",
        "--blocks",
        "1",
        "--seed",
        "6",
        "--variant",
        "minus:faster.patch",
        "--variant",
        "upstream",
        "--json",
    )
    assert again.code == 0, again.err  # slower is not measured: nothing contradicted
    second = json.loads(again.out)
    assert [
        (v["spec"]["name"], v["build_id"], v["reused"], v["bytes_sent"]) for v in second["variants"]
    ] == [(name, ids[name], True, 0) for name in ("full", "minus:faster.patch", "upstream")]
    assert {c["expectation"]["patch"]: c["verdict"] for c in second["checks"]} == {
        "faster.patch": "confirmed",
        "slower.patch": "not measured",
    }


def test_a_patch_that_conflicts_without_an_earlier_one_is_reported_and_the_rest_is_measured(
    kz, bench_tiny, tmp_path
):
    device_root = tmp_path / "device"
    bench_tiny.project.write(
        "recipes/devices.yaml",
        f"devices:\n  bench-box:\n    transport: local\n    root: {device_root}\n",
    )
    (device_root / "models").mkdir(parents=True)
    (device_root / "models" / "q.gguf").write_bytes(b"GGUF stand-in")
    bench_tiny.add_patch(
        "faster.patch",
        {"ggml/src/ggml.c": SPEED.replace("100.0", "120.0")},
        "ggml: faster" + TRAILERS,
    )
    # written on top of faster: without it, its context is not there
    faster_tip = bench_tiny.upstream.commit(
        {"ggml/src/ggml.c": SPEED.replace("100.0", "120.0")}, "faster, as a base"
    )
    bench_tiny.add_patch(
        "retune.patch",
        {"ggml/src/ggml.c": SPEED.replace("100.0", "150.0")},
        "ggml: retune" + TRAILERS,
        base=faster_tip,
    )
    result = kz(
        "ab",
        "tiny",
        "--device",
        "bench-box",
        "-m",
        "models/q.gguf",
        "--blocks",
        "2",
        "--seed",
        "1",
        "--markdown",
    )
    assert result.code == 0, result.err
    assert (
        "**minus:faster.patch could not be built:** patch retune.patch does not apply to upstream"
        in result.out
    )
    assert "(the stack without faster.patch)" in result.out
    assert "variant minus:faster.patch cannot be built" in " ".join(result.err.split())
    lines = [line for line in result.out.splitlines() if line.startswith("| retune.patch |")]
    assert len(lines) == 1 and "| 150.00 | 120.00 | +25.0%" in lines[0]
