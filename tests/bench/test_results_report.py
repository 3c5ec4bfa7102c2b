"""`kzbuild results report`: the history in one self-contained HTML file, opened in headless
Chromium as a user would: the plots render, no console error, hovering a point shows its
provenance. The screenshot is kept under .kz/screenshots/ for a reviewer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from kzbuild.measure import report
from kzbuild.measure.resultsdb import ResultsStore
from tests.bench.benchkit import history
from tests.conftest import REPO_ROOT

SCREENSHOTS = REPO_ROOT / ".kz" / "screenshots"

# Test-only additions to a copy of the report: record page errors and console errors, then,
# once loaded, hover the first point of the first series and write what the page shows.
CATCH_ERRORS = """<script>window.kzErrors = [];
window.addEventListener('error', e => window.kzErrors.push(String(e.message)));
const kzConsoleError = console.error;
console.error = (...a) => { window.kzErrors.push(a.join(' ')); kzConsoleError(...a); };</script>"""
PROBE = """<script>window.addEventListener('load', () => setTimeout(() => {
  const divs = [...document.querySelectorAll('.plotly-graph-div')];
  const drawn = divs.filter(g => g._fullLayout
    && g.querySelectorAll('.scatterlayer .trace').length > 0).length;
  const g = divs[0];
  const i = g.data.findIndex(t => t.customdata);
  const t = g.data[i];
  Plotly.Fx.hover(g, [{curveNumber: i, pointNumber: 0}], (t.xaxis || 'x') + (t.yaxis || 'y'));
  const hover = g.querySelector('.hoverlayer').textContent;
  const probe = document.createElement('pre');
  probe.id = 'kz-probe';
  probe.textContent = JSON.stringify({figures: divs.length, drawn, hover, errors: window.kzErrors});
  document.body.prepend(probe);
}, 200));</script>"""


def instrumented(page: Path, to: Path) -> Path:
    text = page.read_text()
    to.write_text(
        text.replace("<head>", "<head>" + CATCH_ERRORS, 1).replace("</body>", PROBE + "</body>", 1)
    )
    return to


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary, "chromium is missing: scripts/setup installs it (Debian package chromium)"
    argv = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--virtual-time-budget=15000",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_the_report_renders_in_chromium_and_a_hover_shows_provenance(kz, project, tmp_path):
    with ResultsStore(project.root / "results") as store:
        store.add(history(24, devices=("pad3", "pad4"), step_at=12))
    out = tmp_path / "report.html"
    made = kz("results", "report", "-o", str(out))
    assert made.code == 0, made.err
    assert f"wrote {out}" in made.out.replace("\n", "")
    page = out.read_text()
    assert not re.search(
        r"<script[^>]+src=|<link[^>]+href=|@import", page
    )  # nothing fetched: plotly.js is inline
    assert (
        "Step changes" in page and "-20.0%" in page
    )  # the drop at build 12, with its commit range
    probe_page = instrumented(out, tmp_path / "probe.html")
    dumped = chromium("--dump-dom", probe_page.as_uri())
    found = re.search(r'<pre id="kz-probe">(.*?)</pre>', dumped.stdout, re.S)
    assert found, dumped.stderr[-2000:]
    probe = json.loads(
        found.group(1)
        .replace("&quot;", '"')
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
    )
    assert probe["errors"] == []
    assert (
        probe["figures"] == 2 and probe["drawn"] == 2
    )  # a figure per device, each with its traces drawn
    for provenance in (
        "build b00000",
        "lock " + f"{0:064x}"[:16],
        "device pad3",
        "model sha256 " + "a" * 16,
        "upstream 0000000c0f",
    ):
        assert provenance in probe["hover"], (provenance, probe["hover"])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "results-report.png"
    shot.unlink(missing_ok=True)
    taken = chromium(f"--screenshot={shot}", "--window-size=1400,1600", probe_page.as_uri())
    assert shot.is_file() and shot.stat().st_size > 20_000, taken.stderr[-2000:]
    print(f"screenshot of the report with a hovered point: {shot}")


def test_memory_and_quality_are_drawn_when_records_carry_them():
    """Fields another kzbuild may add to the stored form; absent or not numbers, left out."""
    base = json.loads(json.dumps(history(1)[0].to_dict()))
    rows = [
        base | {"peak_rss_bytes": 2.5e9, "kld_mean": 0.012},
        base | {"run_id": "r2", "peak_rss_bytes": "a lot", "kld_mean": None},
        base | {"run_id": "r3", "raw": {"peak_rss_bytes": 2.6e9}},
    ]
    [device] = report.history(rows)
    assert sorted(device.series) == [
        "peak memory (peak_rss_bytes)",
        "prefill tok/s",
        "quality (kld_mean)",
    ]
    [memory] = device.series["peak memory (peak_rss_bytes)"].values()
    assert (memory[0].low, memory[0].high, memory[0].runs) == (2.5e9, 2.6e9, 2)


def test_a_step_needs_builds_on_both_sides_beyond_noise():
    steady = [
        p
        for p in report.history(r.to_dict() for r in history(12))[0]
        .series["prefill tok/s"]
        .values()
    ]
    assert all(report.find_step(points) is None for points in steady)
    [dropped] = [
        report.find_step(points)
        for label, points in report.history(r.to_dict() for r in history(12, step_at=6))[0]
        .series["prefill tok/s"]
        .items()
        if "[" not in label
    ]
    assert dropped is not None and round(dropped[0], 1) == -20.0
    assert (dropped[1].build_id, dropped[2].build_id) == ("b00005", "b00006")


def test_a_long_history_is_drawn_in_buckets_of_builds_named_by_their_range():
    [device] = report.history(r.to_dict() for r in history(400))
    every = device.series["prefill tok/s"]["pp512 aaaaaaaa t=8 ngl=99 b=512"]
    drawn = report.thin(every)
    assert len(every) == 400 and len(drawn) == 134 <= report.MAX_POINTS
    assert re.fullmatch(r"b00000\.\.b\d{5} \(3 builds\)", drawn[0].build_id)
    assert (drawn[0].runs, drawn[0].samples) == (3, 9)
    assert sum(p.runs for p in drawn) == 400
    pins = [e for e in report.thin_events(device.events, 10) if e.kind == report.PIN]
    assert len(pins) == 10 and "(+13 more to " in pins[0].text


def test_an_empty_history_has_no_report(kz, project):
    result = kz("results", "report")
    assert result.code == 13 and "nothing to report" in result.err


def test_a_report_that_cannot_be_written_says_where(kz, project, tmp_path):
    with ResultsStore(project.root / "results") as store:
        store.add(history(2))
    (tmp_path / "a-file").write_text("")
    result = kz("results", "report", "-o", str(tmp_path / "a-file" / "report.html"))
    assert (
        result.code == 2 and "cannot write the report to" in result.err and "-o names" in result.err
    )
