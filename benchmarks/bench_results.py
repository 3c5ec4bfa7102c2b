#!/usr/bin/env python3
"""Results at a team's scale: what `results show`, `compare`, an import and the report cost as
the stored history grows. Every goal is a ratio (or a bound) measured in this one run.

    python benchmarks/bench_results.py [--large 1000000] [--small 1000] [--report 100000]

Records are generated in their stored form (canonical JSON lines in monthly shards, two tests
and two thread counts per run, three devices, a build every three runs) and the database is
built from the shards by opening the store, as a clone does. Goals (issue 26):
- `results show RUN` at --large stored records <= 1.5x the same at --small (CPU of the command);
- `compare` of two builds with 1k records each <= 0.5 s CPU;
- adding 100 records to the --large database <= 2x adding them to an empty one;
- doubling the records shown at most doubles the time (`results show` of one build, in-process,
  4k to 32k records, interleaved rounds, medians);
- a table of 250 runs: rich (terminal) and plain (pipe) rendering times;
- the report of --report records: file <= 20 MB, shown in headless Chromium <= 3 s after the
  navigation started (browser start-up measured apart; see report_figures).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.measure import compare, report  # noqa: E402
from kzbuild.measure.resultfiles import shard_name  # noqa: E402
from kzbuild.measure.resultsdb import ResultsStore  # noqa: E402
from kzbuild.model.result import BenchRecord, canonical_json  # noqa: E402
from tests.bench.benchkit import record  # noqa: E402

TESTS = (("pp512", 8, 100.0), ("tg128", 8, 20.0), ("pp512", 4, 60.0), ("tg128", 4, 14.0))
DEVICES = ("pad3", "pad4", "pad5")
SPAN_S = 2 * 365 * 86400  # the generated history covers two years


def stored_lines(
    count: int, *, start: int = 0, prefix: str = "run", build: str | None = None
) -> list[str]:
    """``count`` records in their stored form, fast: a template's dict with the fields that vary."""
    template = record().to_dict()
    runs = max(count // len(TESTS), 1)
    lines = []
    for i in range(start, start + count):
        run = i // len(TESTS)
        test, threads, base = TESTS[i % len(TESTS)]
        build_id = build or f"b{run // 3:06d}"
        stamp = 1_735_689_600 + (run * SPAN_S) // max(runs, 1)
        data = dict(template)
        level = base * (1 + (run % 7) / 100)
        data.update(
            run_id=f"{prefix}-{run:07d}",
            seq=i % len(TESTS),
            test=test,
            host_time=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(stamp)),
            samples_ts=[level, level * 1.01, level * 0.99],
            avg_ts=level,
            config={**template["config"], "n_threads": threads},
            device={**template["device"], "name": DEVICES[run % len(DEVICES)]},
            build={
                **template["build"],
                "build_id": build_id,
                "build_commit": f"{run // 30:040x}",
                "lock_sha256": f"{run // 30:064x}",
            },
            env={"GGML_SEED": str(run % 3)},
        )
        lines.append(canonical_json(data))
    return lines


def write_shards(folder: Path, lines: list[str]) -> None:
    by_shard: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        by_shard[shard_name(json.loads(line)["host_time"])].append(line + "\n")
    folder.mkdir(parents=True, exist_ok=True)
    for name, shard in by_shard.items():
        with open(folder / name, "a") as file:
            file.write("".join(shard))


def cpu() -> float:
    return time.process_time()


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def kz_cpu(folder: Path, *args: str, repeat: int = 3) -> float:
    """Median CPU seconds of a kzbuild command (a fresh process, output to a pipe)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    times = []
    for _ in range(repeat):
        before = child_cpu()
        done = subprocess.run(
            [sys.executable, "-m", "kzbuild", "--results-dir", str(folder), *args],
            capture_output=True,
            text=True,
            env=env,
        )
        times.append(child_cpu() - before)
        assert done.returncode in (0, 9), done.stderr
    return statistics.median(times)


def timed(action: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        before = cpu()
        action()
        times.append(cpu() - before)
    return statistics.median(times)


def build_store(folder: Path, count: int) -> float:
    write_shards(folder, stored_lines(count))
    started = time.perf_counter()
    ResultsStore(folder).close()  # the first open imports every shard
    return time.perf_counter() - started


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--report", type=int, default=100_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-results-"))
    try:
        run(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, args: argparse.Namespace) -> None:
    small, large = work / "small", work / "large"
    print(f"building stores: {args.small} and {args.large} records")
    built_small = build_store(small, args.small)
    built_large = build_store(large, args.large)
    print(
        f"  first import (database built from the shards): {args.small}: {built_small:.2f} s, "
        f"{args.large}: {built_large:.1f} s"
    )
    for folder in (small, large):
        add_compared_builds(folder)
        ResultsStore(folder).close()  # reads the two builds in before anything is timed

    # show one run: cost follows what is shown, not what is stored
    show_small = kz_cpu(small, "results", "show", "run-0000000", repeat=5)
    show_large = kz_cpu(large, "results", "show", "run-0000000", repeat=5)
    print(
        f"results show RUN (CPU of the command): {show_small:.3f} s at {args.small}, "
        f"{show_large:.3f} s at {args.large}: "
        f"{show_large / show_small:.2f}x (goal <= 1.5x) {verdict(show_large <= 1.5 * show_small)}"
    )

    # compare two builds of 1k records each, in the large store
    with ResultsStore(large) as store:
        spent = timed(
            lambda: compare.compare(
                store.records("cmpA"), store.records("cmpB"), a_label="A", b_label="B"
            )
        )
    command = kz_cpu(large, "results", "compare", "cmpA", "cmpB")
    print(
        f"compare two builds of 1000 records: {spent:.3f} s CPU in-process (goal <= 0.5 s) "
        f"{verdict(spent <= 0.5)}; "
        f"the whole command {command:.2f} s CPU"
    )

    # an import is incremental: five batches of 100 into each, the median
    adds: dict[str, list[float]] = {"empty": [], "large": []}
    for round_ in range(5):
        lines = stored_lines(100, start=10_000_000 + 100 * round_, prefix="new")
        records = [BenchRecord.from_dict(json.loads(line)) for line in lines]
        for name, folder in (("empty", work / f"empty{round_}"), ("large", large)):
            folder.mkdir(exist_ok=True)
            before = cpu()
            with ResultsStore(folder) as store:
                assert store.add(records) == 100
            adds[name].append(cpu() - before)
    empty, full = statistics.median(adds["empty"]), statistics.median(adds["large"])
    print(
        f"add 100 records (open, add, close; CPU, median of 5): empty {empty:.3f} s, "
        f"{args.large} stored {full:.3f} s: {full / empty:.2f}x (goal <= 2x) "
        f"{verdict(full <= 2 * empty)}"
    )

    doubling(work / "doubling")
    table_times()
    report_figures(work, args.report, large if args.report == args.large else None)


def add_compared_builds(folder: Path) -> None:
    write_shards(
        folder,
        stored_lines(1000, start=0, prefix="cmpa", build="cmpA")
        + stored_lines(1000, start=0, prefix="cmpb", build="cmpB"),
    )


def table_times() -> None:
    from rich.console import Console
    from rich.table import Table

    from kzbuild.cli import ui

    rows = [
        [
            f"2026120{n % 10}T10{n:04d}Z-3f9a2c",
            "bench",
            "2026-12-01T10:00:00+00:00",
            "pad3",
            f"b{n:016x}",
            "qwen35-4b q4_0",
            "pp512 tg128",
            "4",
        ]
        for n in range(250)
    ]
    headers = ["run", "kind", "time", "device", "build", "model", "tests", "records"]

    def rich_table() -> None:
        table = Table(title="results")
        for header in headers:
            table.add_column(header, overflow="fold", no_wrap=header in ("run", "build"))
        for row in rows:
            table.add_row(*row)
        Console(file=io.StringIO(), width=120, force_terminal=True).print(table)

    def plain_table() -> None:
        stdout, sys.stdout = sys.stdout, io.StringIO()
        try:
            ui.say_grid("results", headers, rows)
        finally:
            sys.stdout = stdout

    print(
        f"a table of 250 runs: rich (a terminal) {timed(rich_table):.3f} s, plain (a pipe) "
        f"{timed(plain_table):.4f} s"
    )


DOUBLING_SIZES = (4000, 8000, 16000, 32000)  # large enough that fixed costs do not dominate
DOUBLING_ROUNDS = 7


def doubling(folder: Path) -> None:
    """`results show BUILD` of N records (CPU of the command, to a pipe) less the same command
    for a run of 4 records (start-up, imports, opening the store), each size once per round in
    turn so that a change in the machine's load falls on every size alike; the median of the
    rounds per size."""
    sizes = DOUBLING_SIZES
    write_shards(
        folder, [line for n in sizes for line in stored_lines(n, prefix=f"big{n}", build=f"big{n}")]
    )
    ResultsStore(folder).close()
    spent: dict[int, list[float]] = defaultdict(list)
    for round_ in range(DOUBLING_ROUNDS):
        fixed = kz_cpu(folder, "results", "show", f"big{sizes[0]}-0000000", repeat=1)
        for n in sizes[round_ % len(sizes) :] + sizes[: round_ % len(sizes)]:
            spent[n].append(kz_cpu(folder, "results", "show", f"big{n}", repeat=1) - fixed)
    costs = [statistics.median(spent[n]) for n in sizes]
    steps = [later / earlier for earlier, later in zip(costs, costs[1:], strict=False)]
    # the slope of log(time) over log(records): 1 is linear, and 2**slope the doubling ratio
    logs = [(math.log(n), math.log(c)) for n, c in zip(sizes, costs, strict=True)]
    mean_x = statistics.fmean(x for x, _ in logs)
    mean_y = statistics.fmean(y for _, y in logs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in logs) / sum(
        (x - mean_x) ** 2 for x, _ in logs
    )
    spread = max((max(spent[n]) - min(spent[n])) / statistics.median(spent[n]) * 100 for n in sizes)
    print(
        f"results show BUILD of N records, less one of 4 (CPU of the command; median of "
        f"{DOUBLING_ROUNDS} interleaved rounds, spread up to {spread:.0f}%): "
        + ", ".join(f"{n}: {c:.3f} s" for n, c in zip(sizes, costs, strict=True))
        + f"; doubling ratios {', '.join(f'{s:.2f}' for s in steps)}, fitted 2^{slope:.3f} = "
        f"{2**slope:.2f} (goal <= 2) {verdict(2**slope <= 2.0)}"
    )


# Marks added to a copy of the report: when its plotly.js has run, and each figure's drawing.
MARKS = """<script>performance.mark('plotly.js evaluated'); window.kzDraws = [];
const kzNewPlot = Plotly.newPlot;
Plotly.newPlot = (...args) => { const start = performance.now();
  return kzNewPlot(...args).then(g => { kzDraws.push([start, performance.now()]); return g; }); };
</script>"""
# Waits until every figure in the window is drawn and two frames have passed (the drawn figures
# painted); the times since navigation started, in ms.
SHOWN = """new Promise(done => {
  const inView = g => { const r = g.getBoundingClientRect();
    return r.top < innerHeight && r.bottom > 0; };
  const check = () => {
    const figures = [...document.querySelectorAll('.kz-figure')];
    const wanted = figures.filter(inView);
    if (!wanted.every(g => g._fullLayout && g.querySelector('.scatterlayer .trace')))
      return setTimeout(check, 5);
    requestAnimationFrame(() => requestAnimationFrame(() => done({
      shown: performance.now(),
      js: performance.getEntriesByName('plotly.js evaluated')[0].startTime,
      firstDraw: kzDraws[0], inView: wanted.length, figures: figures.length,
      drawn: figures.filter(g => g._fullLayout).length})));
  };
  check();
})"""
OPENINGS = 7


def opening(page: Path) -> dict[str, float]:
    """Open ``page`` in a fresh headless Chromium (1400x900); the medians over OPENINGS of: the
    browser's start-up, then from navigation start: plotly.js evaluated, the first figure drawn,
    every figure in the window drawn and painted."""
    from tests.chromium import Chromium

    found: dict[str, list[float]] = defaultdict(list)
    for _ in range(OPENINGS):
        started = time.perf_counter()
        with Chromium(1400, 900) as browser:
            found["startup"].append((time.perf_counter() - started) * 1000)
            browser.open(page)
            shown = browser.run(SHOWN)
            assert browser.errors() == [], browser.errors()
        found["js"].append(shown["js"])
        found["draw"].append(shown["firstDraw"][1] - shown["firstDraw"][0])
        found["shown"].append(shown["shown"])
        found["in view"].append(shown["inView"])
        found["drawn"].append(shown["drawn"])
        found["figures"].append(shown["figures"])
    return {name: statistics.median(values) for name, values in found.items()}


def report_figures(work: Path, count: int, existing: Path | None) -> None:
    """The report of ``count`` records: its size, and how long it takes to open. 'Opens' is from
    the browser starting to load the file (navigation start) to every figure in the window drawn
    and painted: the browser's own start-up, the same for any page and paid once by a user whose
    browser is running, is measured apart."""
    from plotly.offline import get_plotlyjs

    folder = existing or work / "report"
    if existing is None:
        build_store(folder, count)
    out = work / "report.html"
    with ResultsStore(folder) as store:
        started = time.perf_counter()
        report.write_report(store.stored(), out)
        made = time.perf_counter() - started
    size = out.stat().st_size / 1e6
    page = out.read_text()
    bundle = report.plotly_js()
    basic = bundle != get_plotlyjs()
    print(
        f"report of {count} records: written in {made:.1f} s, {size:.1f} MB (goal <= 20 MB) "
        f"{verdict(size <= 20)}; plotly.js: {'basic' if basic else 'full'} bundle"
    )
    if not shutil.which("chromium"):
        print("  chromium missing: scripts/setup installs it")
        return
    pages = {"report": page}
    if basic:  # the fallback when the basic bundle is not installed
        pages["report with plotly's full bundle"] = page.replace(bundle, get_plotlyjs(), 1)
    for name, text in pages.items():
        probe = work / "probe.html"
        marked = text.replace("</script>", "</script>" + MARKS, 1)  # after plotly.js
        probe.write_text(marked)
        t = opening(probe)
        print(
            f"  {name}, opened in headless Chromium (median of {OPENINGS} fresh browsers): "
            f"shown {t['shown'] / 1000:.2f} s after navigation start (goal <= 3 s) "
            f"{verdict(t['shown'] <= 3000)}: plotly.js evaluated at {t['js'] / 1000:.2f} s, "
            f"the first figure drawn in {t['draw'] / 1000:.2f} s; {t['in view']:.0f} of "
            f"{t['figures']:.0f} figures in the window, {t['drawn']:.0f} drawn; the browser's "
            f"start-up before it {t['startup'] / 1000:.2f} s"
        )


if __name__ == "__main__":
    main()
