"""`kzbuild results report`: the history in one self-contained HTML file, opened in headless
Chromium as a user would: the plots render, each when it comes into view, no console error,
hovering a point shows its provenance. The screenshot is kept under .kz/screenshots/ for a
reviewer."""

from __future__ import annotations

import json
import re

from kzbuild.measure import report
from kzbuild.measure.resultsdb import ResultsStore
from tests.bench.benchkit import history
from tests.chromium import Chromium
from tests.conftest import REPO_ROOT

SCREENSHOTS = REPO_ROOT / ".kz" / "screenshots"

# Run in the page: wait until a figure is drawn, its traces in it (at most 10 s).
DRAWN = """async g => {
  for (let i = 0; i < 200 && !(g._fullLayout && g.querySelector('.scatterlayer .trace')); i++)
    await new Promise(done => setTimeout(done, 50));
  return Boolean(g._fullLayout);
}"""
FIGURES = "[...document.querySelectorAll('.kz-figure')]"
# Hover the first point of the first figure's first measured series; what the page then shows.
HOVER = """(() => {
  const g = document.querySelector('.kz-figure');
  const i = g.data.findIndex(t => t.customdata);
  const t = g.data[i];
  Plotly.Fx.hover(g, [{curveNumber: i, pointNumber: 0}], (t.xaxis || 'x') + (t.yaxis || 'y'));
  return g.querySelector('.hoverlayer').textContent;
})()"""


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
    with Chromium(1400, 1000) as browser:
        browser.open(out)
        assert browser.run(f"({DRAWN})(document.querySelector('.kz-figure'))")
        # a figure per device; the second, below the window, is drawn once scrolled to
        assert browser.run(f"{FIGURES}.map(g => Boolean(g._fullLayout))") == [True, False]
        assert browser.run(
            f"(async () => {{ const drawn = []; for (const g of {FIGURES}) "
            f"{{ g.scrollIntoView(); drawn.push(await ({DRAWN})(g)); }} "
            "window.scrollTo(0, 0); return drawn; })()"
        ) == [True, True]
        hover = browser.run(HOVER)
        for provenance in (
            "build b00000",
            "lock " + f"{0:064x}"[:16],
            "device pad3",
            "model sha256 " + "a" * 16,
            "upstream 0000000c0f",
        ):
            assert provenance in hover, (provenance, hover)
        assert browser.errors() == []
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = SCREENSHOTS / "results-report.png"
        shot.unlink(missing_ok=True)
        browser.screenshot(shot)
    assert shot.stat().st_size > 20_000
    print(f"screenshot of the report with a hovered point: {shot}")


def test_a_console_error_in_the_page_is_seen(tmp_path):
    """The browser test's error check sees what a broken page would show."""
    page = tmp_path / "broken.html"
    page.write_text("<script>console.error('bad', 1); undefinedFunction();</script>")
    with Chromium() as browser:
        browser.open(page)
        errors = browser.errors()
    assert errors[0] == "bad 1" and "undefinedFunction is not defined" in errors[1]


def test_the_basic_bundle_is_used_only_when_it_is_installed_and_of_plotlys_version(tmp_path):
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    assert report.plotly_js() == report.BASIC_BUNDLE.read_text(), (
        "the report inlines plotly's full bundle: scripts/setup installs the basic one (npm ci)"
    )
    header = report.BASIC_BUNDLE.read_text()[:200]
    assert f"plotly.js (basic - minified) v{get_plotlyjs_version()}" in header
    other = tmp_path / "plotly-basic.min.js"
    other.write_text(header.replace(get_plotlyjs_version(), "0.0.1"))
    for missing_or_other in (tmp_path / "missing.js", other):
        assert report.plotly_js(missing_or_other) == get_plotlyjs()


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


def test_a_record_text_cannot_end_the_figure_script():
    rows = [r.to_dict() for r in history(2)]
    hostile = "</script><!--<script>alert(1)</script>"
    rows[0]["device"]["name"] = hostile
    page = report.render(report.history(rows), records=2)
    specs = re.findall(r"<script type='application/json' id='device-\d-figure'>(.*?)</", page)
    assert len(specs) == 2 and all("<" not in spec for spec in specs)
    assert [json.loads(spec)["layout"]["title"]["text"] for spec in specs] == [hostile, "pad3"]


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
