"""kzbuild ab on the command line: usage errors before any work, --cool-to on this machine, --plot
and markdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ab.conftest import SPEED
from tests.ab.test_ab_tiny import TRAILERS


def local_device(tiny, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    root = tmp_path / "device"
    (root / "models").mkdir(parents=True)
    (root / "models" / "q.gguf").write_bytes(b"GGUF stand-in")
    tiny.add_patch(
        "faster.patch",
        {"ggml/src/ggml.c": SPEED.replace("100.0", "120.0")},
        "ggml: faster" + TRAILERS,
    )
    return root


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--cool-to", "hot"], "--cool-to 'hot' is not a temperature"),
        (["--variant", "everything"], "there is no variant 'everything'"),
        (["--blocks", "0"], "Invalid value for '--blocks'"),
        (["-t", "0"], "-t '0' must be at least 1"),
        (["--cool-to", "45C", "--cool-wait", "nan"], "--cool-wait nan"),
    ],
)
def test_usage_errors_exit_2_before_anything_is_built(kz, bench_tiny, tmp_path, args, said):
    root = local_device(bench_tiny, tmp_path)
    result = kz("ab", "tiny", "--device", f"local:{root}", "-m", "models/q.gguf", *args)
    assert result.code == 2, (result.code, result.err)
    assert said in " ".join(result.err.split())
    assert not (bench_tiny.project.work / "ab").exists()


def test_cool_to_reads_this_machines_thermal_zones_or_says_there_are_none(kz, bench_tiny, tmp_path):
    root = local_device(bench_tiny, tmp_path)
    result = kz(
        "ab",
        "tiny",
        "--device",
        f"local:{root}",
        "-m",
        "models/q.gguf",
        "--blocks",
        "1",
        "--cool-to",
        "150C",
        "--json",
    )
    if not list(
        Path("/sys/class/thermal").glob("thermal_zone*/temp")
    ):  # this machine (a container): none
        assert result.code == 8
        assert (
            "no thermal zones to read (/sys/class/thermal/thermal_zone*/temp: none readable)"
            in " ".join(result.err.split())
        )
        assert not (bench_tiny.project.work / "ab").exists()  # checked before any build
    else:
        assert result.code == 0, result.err
        (start,) = json.loads(result.out)["runs"][0]["starts"]
        assert start["cooled"] and start["temperatures"]


def test_markdown_and_plot(kz, bench_tiny, tmp_path):
    root = local_device(bench_tiny, tmp_path)
    plot = tmp_path / "ab.png"
    result = kz(
        "ab",
        "tiny",
        "--device",
        f"local:{root}",
        "-m",
        "models/q.gguf",
        "--blocks",
        "2",
        "--seed",
        "4",
        "--markdown",
        "--plot",
        str(plot),
    )
    assert result.code == 0, result.err
    assert (
        "| faster.patch | pp32 | t=1 | 120.00 | 100.00 | +20.0% (95% interval [+20.0%, +20.0%]) |"
        in result.out
    )
    assert "| whole stack (vs upstream) | pp32 | t=1 | 120.00 | 100.00 | +20.0%" in result.out
    assert plot.read_bytes()[:4] == b"\x89PNG"
    text = kz(
        "ab",
        "tiny",
        "--device",
        f"local:{root}",
        "-m",
        "models/q.gguf",
        "--blocks",
        "1",
        "--variant",
        "upstream",
    )
    assert text.code == 0, text.err
    assert (
        "what each patch buys" in text.out
        and "faster.patch" not in text.out.split("what each patch buys")[1]
    )


def test_ab_runs_a_plan_whose_ab_section_the_command_line_overrides(kz, bench_tiny, tmp_path):
    root = local_device(bench_tiny, tmp_path)
    import hashlib

    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "model: {path: models/q.gguf, sha256: "
        + hashlib.sha256(b"GGUF stand-in").hexdigest()
        + "}\n"
        f"device: local:{root}\nrepetitions: 2\nseed: 11\n"
        "runs:\n  - {name: one-thread, options: {t: 1}}\n  - {name: two-threads, options: {t: 2}}\n"
        "ab: {variants: [upstream], blocks: 3}\n"
    )
    result = kz("ab", "tiny", "--plan", str(plan), "--blocks", "2", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert [v["spec"]["name"] for v in report["variants"]] == ["full", "upstream"]
    assert [(r["name"], r["seed"], len(r["order"])) for r in report["runs"]] == [
        ("one-thread", 11, 2),
        ("two-threads", 11, 2),
    ]
    assert (
        report["seed"] == 11 and len(report["effects"]) == 1
    )  # the tiny llama-bench reports t=1 whatever -t says
    refused = kz("ab", "tiny", "--plan", str(plan), "-m", "models/q.gguf")
    assert refused.code == 2 and "-m cannot be given with it" in refused.err


def test_a_second_ab_of_the_same_recipe_is_busy(kz, bench_tiny, tmp_path):
    from kzbuild.adapters.filelock import locked

    root = local_device(bench_tiny, tmp_path)
    with locked(bench_tiny.project.work / "ab" / "tiny" / ".lock", what="another ab"):
        result = kz(
            "ab", "tiny", "--device", f"local:{root}", "-m", "models/q.gguf", "--blocks", "1"
        )
    assert result.code == 10, result.err
    assert "the ab worktree of tiny" in " ".join(result.err.split())
