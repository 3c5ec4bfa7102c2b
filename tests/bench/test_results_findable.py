"""Results a newcomer can find and read: pointers from an empty results dir, spread explained
and noisy rows flagged, ids never cut at 80 columns."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Any

from kzbuild.measure.resultfiles import DEMO_RESULTS
from kzbuild.measure.resultsdb import ResultsStore
from tests.bench.benchkit import flat, record
from tests.bench.test_results import REPO_SEED
from tests.conftest import REPO_ROOT

RUN_ID = "20261203T104512Z-3f9a2c"
BUILD_ID = "host-20f562fbe4eda1aa"
TEXT: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 120}


def test_without_a_chosen_dir_the_reading_commands_show_the_demo_s_results_and_say_so(kz, project):
    demo = project.work / DEMO_RESULTS
    with ResultsStore(demo) as store:
        store.add([record(run_id="r1"), record(run_id="r1", test="tg128", seq=1)])
    committed = project.root / "results"  # as in the repo: the seed figures, no measurements
    committed.mkdir()
    shutil.copy(REPO_SEED, committed)
    before = sorted(committed.iterdir())
    note = f"results from {demo.resolve()} (the demo's; {committed} holds no measured results)"
    for command in (["list"], ["show", "latest"], ["compare", "r1", "r1"], ["plot"]):
        result = kz("results", *command)
        assert result.code == 0, (command, result.err)
        assert note in flat(result.err), command
    assert "r1" in kz("results", "list").out
    assert (demo / "plot.png").stat().st_size > 1000  # the plot goes beside the results it shows
    assert sorted(committed.iterdir()) == before  # the project's results/ is only read
    # manual reference rows are not measurements: the demo's results are still the ones shown
    assert kz("results", "import-seed").code == 0
    assert note in flat(kz("results", "show", "r1").err)


def test_a_chosen_results_dir_without_measurements_points_to_the_dirs_that_hold_some(kz, project):
    demo = project.work / DEMO_RESULTS
    with ResultsStore(demo) as store:
        store.add([record(run_id="r1"), record(run_id="r1", test="tg128", seq=1)])
    chosen = project.root / "results"
    pointer = (
        f"{chosen} holds no measured results; they are in {demo.resolve()} (2 records): "
        "pass --results-dir DIR or set KZ_RESULTS_DIR=DIR"
    )
    for command in (["show", "latest"], ["compare", "r1", "r1"], ["plot"]):
        result = kz("--results-dir", str(chosen), "results", *command)
        assert result.code == 13, command
        assert pointer in flat(result.err), command
    listed = kz("--results-dir", str(chosen), "results", "list")
    assert listed.code == 0 and pointer in flat(listed.out)
    assert "results from" not in flat(listed.err)
    # the pointer works: the demo's results are there
    assert kz("--results-dir", str(demo), "results", "show", "r1").code == 0


def test_a_results_dir_with_measurements_gets_no_pointer(kz, project):
    with ResultsStore(project.work / DEMO_RESULTS) as store:
        store.add([record(run_id="r1")])
    with ResultsStore(project.root / "results") as store:
        store.add([record(run_id="r2")])
    result = kz("results", "show", "nope")
    assert (
        result.code == 13
        and "no results match 'nope'" in flat(result.err)
        and "holds no measured results" not in flat(result.err)
    )


def test_spread_is_explained_and_rows_above_the_noise_threshold_are_flagged(kz, project):
    with ResultsStore(project.root / "results") as store:
        store.add(
            [
                record(run_id="r1", samples=(100.0, 120.0, 99.0)),
                record(run_id="r1", test="tg128", seq=1, samples=(10.0, 10.1, 10.05)),
            ]
        )
    result = kz("results", "show", "r1", "--markdown")
    assert result.code == 0, result.err
    rows = {
        line.split("|")[1].strip(): line
        for line in result.out.splitlines()
        if line.startswith("| pp") or line.startswith("| tg")
    }
    assert rows["pp512"].endswith("| 21.0% (n=3) ! | - | - |  |")  # (120 - 99) / 100
    assert rows["tg128"].endswith("| 1.0% (n=3) | - | - |  |")
    out = flat(result.out)
    assert "spread: (max - min) of the samples as % of their median; n: samples" in out
    assert (
        "!: 1 spread(s) above 5%: too noisy to trust small differences; raise -r (more "
        "repetitions) or add --cooldown SECONDS between runs" in out
    )
    compared = flat(kz("results", "compare", "r1", "r1").out)
    assert "!: 2 spread(s) above 5%" in compared


def test_a_quiet_run_gets_the_footnote_but_no_flag(kz, project):
    with ResultsStore(project.root / "results") as store:
        store.add([record(run_id="r1", samples=(100.0, 101.0, 100.5))])
    out = flat(kz("results", "show", "r1").out)
    assert "spread: (max - min)" in out and "!:" not in out


def test_ids_are_whole_at_80_columns_and_each_shown_id_selects_its_results(
    kz, project, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "80")
    with ResultsStore(project.root / "results") as store:
        store.add(
            [
                record(run_id=RUN_ID, build_id=BUILD_ID),
                record(run_id=RUN_ID, build_id=BUILD_ID, test="tg128", seq=1),
            ]
        )
    listed = kz("results", "list")
    assert listed.code == 0, listed.err
    row = next(
        line for line in listed.out.splitlines() if RUN_ID in line
    )  # the run id on one line, whole
    shown_build = re.search(r"host-[0-9a-f]+", row)
    assert shown_build and BUILD_ID.startswith(shown_build[0]) and "…" not in listed.out
    for selector in (RUN_ID, shown_build[0]):
        shown = kz("results", "show", selector)
        assert shown.code == 0, (selector, shown.err)
        assert f"build {BUILD_ID} " in shown.out


def test_the_demo_ends_by_plotting_and_printing_where_its_results_are_and_how_to_see_them(project):
    """The end of scripts/demo (from its results table on), run as written against stored results;
    the commands it prints then run as a new shell would: scripts/kzbuild, no KZ_RESULTS_DIR."""
    demo = project.work / DEMO_RESULTS
    with ResultsStore(demo) as store:
        store.add([record(run_id="r1"), record(run_id="r1", test="tg128", seq=1)])
    script = (REPO_ROOT / "scripts" / "demo").read_text()
    ending = script[script.index("kz results show latest") :]
    start = f'set -euo pipefail\nkz() {{ {shlex.quote(sys.executable)} -m kzbuild "$@"; }}\n'
    start += 'demo_results="${KZ_WORK_DIR:-$PWD/.kz}/demo-results"\n'
    env = {**os.environ, "KZ_WORK_DIR": str(project.work), "KZ_VENV": sys.prefix, "COLUMNS": "80"}
    env.pop("KZ_RESULTS_DIR", None)
    env |= {"KZ_RESULTS_DIR": str(demo)}  # as the demo sets it for its own commands
    ran = subprocess.run(["bash", "-c", start + ending], cwd=project.root, env=env, **TEXT)
    assert ran.returncode == 0, ran.stderr
    assert (demo / "plot.png").stat().st_size > 1000
    expected = (
        f"The demo's results are in {demo} (YYYY-MM.jsonl shards, results.sqlite3, plot.png)."
    )
    assert expected in ran.stdout
    assert f"The history report: {demo}/report.html" in ran.stdout
    assert "<!DOCTYPE html>" in (demo / "report.html").read_text()[:50]
    commands = re.findall(r"scripts/kzbuild( results .*)", ran.stdout)
    assert commands == [
        " results list",
        " results show latest",
        " results plot --out plot.png",
        " results report -o report.html",
    ]
    wrapper = shlex.quote(str(REPO_ROOT / "scripts" / "kzbuild"))
    plain_env = {k: v for k, v in env.items() if k != "KZ_RESULTS_DIR"}
    plain_env["KZ_PROJECT"] = str(project.root)
    for command in commands:
        again = subprocess.run(
            ["bash", "-c", wrapper + command], cwd=project.root, env=plain_env, **TEXT
        )
        assert again.returncode == 0, (command, again.stderr)
        assert f"results from {demo.resolve()} (the demo's;" in again.stderr
        assert "build-a" in again.stdout or "plot" in command or "report" in command
    assert (project.root / "plot.png").is_file() and (project.root / "report.html").is_file()
