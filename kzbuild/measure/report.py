"""``kzbuild results report``: the history of every device and test in one self-contained HTML file.

Per device, over time: prefill and decode tok/s (median of each build, its min-max as the
spread), and peak memory and quality where records carry them. A row of events marks upstream
pin changes, roll candidates and patch variants; the largest step change of a series (a
regression or a gain) is shaded with the commit range it falls in. Hovering a point shows its
provenance. plotly's JavaScript is inlined: the file needs no server and no network. A device's
figure is drawn when it comes into view, so the page opens as fast with many devices as with one.
"""

from __future__ import annotations

import html
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kzbuild.adapters.files import write_atomic
from kzbuild.errors import ConfigError, ResultsError
from kzbuild.measure.compare import describe_config_fields
from kzbuild.model.ab import FULL, MINUS, UPSTREAM

# Fields other kzbuild versions may record; each is read only when present and a finite number.
MEMORY_FIELDS = ("peak_rss_bytes", "peak_rss", "peak_memory_bytes", "peak_memory")
QUALITY_FIELDS = ("kld_mean", "kld", "mean_kld", "perplexity", "ppl")
REPORT_FILE = "report.html"  # in the results folder, git-ignored
PREFILL, DECODE = "prefill tok/s", "decode tok/s"
STEP_PCT = 5.0  # a step smaller than this is noise
STEP_WINDOW = 3  # builds on each side of a step, all on their side of it
PATCH_VARIANTS = (
    FULL,
    UPSTREAM,
)  # and every "minus:" variant; any other variant is a roll candidate
PIN, CANDIDATE, PATCH = "upstream pin", "roll candidate", "patch variant"


@dataclass(frozen=True)
class Point:
    """One build's measurements of one series: the median of its samples and their range."""

    time: str
    median: float
    low: float
    high: float
    samples: int
    runs: int
    build_id: str
    lock: str
    device: str
    model_sha: str
    commit: str
    variant: str


@dataclass(frozen=True)
class StepChange:
    device: str
    metric: str
    series: str
    change_pct: float
    before: Point  # the last build before the step
    after: Point  # the first build after it


@dataclass(frozen=True)
class Event:
    kind: str  # PIN, CANDIDATE or PATCH
    time: str
    text: str


@dataclass(frozen=True)
class DeviceHistory:
    device: str
    series: Mapping[
        str, Mapping[str, Sequence[Point]]
    ]  # metric -> series label -> points in time order
    events: Sequence[Event]
    steps: Sequence[StepChange]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _field(data: Mapping[str, Any], names: Sequence[str]) -> tuple[str, float] | None:
    """The first of ``names`` the record (or its raw llama-bench JSON) holds as a number."""
    raw = data.get("raw")
    for where in (data, raw if isinstance(raw, Mapping) else {}):
        for name in names:
            value = _number(where.get(name))
            if value is not None:
                return name, value
    return None


def _text(data: Mapping[str, Any], *path: str) -> str:
    value: Any = data
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, str) else ""


def _measurements(data: Mapping[str, Any]) -> list[tuple[str, str, list[float]]]:
    """(metric, unit, values) a stored record holds: its throughput samples, memory, quality."""
    test = _text(data, "test")
    samples = [v for v in (_number(s) for s in data.get("samples_ts") or ()) if v is not None]
    avg = _number(data.get("avg_ts"))
    found = []
    if samples or avg is not None:
        found.append((DECODE if "tg" in test else PREFILL, "tok/s", samples or [avg or 0.0]))
    for names, metric in ((MEMORY_FIELDS, "peak memory"), (QUALITY_FIELDS, "quality")):
        hit = _field(data, names)
        if hit is not None:
            found.append((f"{metric} ({hit[0]})", hit[0], [hit[1]]))
    return found


def history(stored: Iterable[Mapping[str, Any]]) -> list[DeviceHistory]:
    """Per device, each series' points (one per build) and the events and steps on its axis."""
    pooled: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    events: dict[str, dict[tuple[str, str], Event]] = defaultdict(dict)
    last_commit: dict[str, str] = {}
    for data in stored:
        device = _text(data, "device", "name")
        build_id = _text(data, "build", "build_id") or "?"
        variant = _text(data, "variant", "name")
        time = _text(data, "host_time")
        commit = _text(data, "build", "build_commit")
        config = data.get("config")
        label = " ".join(
            part
            for part in (
                _text(data, "test"),
                _text(data, "model", "name") or _text(data, "model", "sha256")[:8],
                describe_config_fields(config if isinstance(config, Mapping) else {}),
                f"[{variant}]" if variant else "",
            )
            if part
        )
        _mark_events(events[device], last_commit, device, time, commit, variant, build_id)
        for metric, _unit, values in _measurements(data):
            point = pooled.setdefault(
                (device, metric, label, build_id), {"values": [], "runs": set(), "data": data}
            )
            point["values"] += values
            point["runs"].add(_text(data, "run_id"))
    by_device: dict[str, dict[str, dict[str, list[Point]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for (device, metric, label, build_id), point in pooled.items():
        by_device[device][metric][label].append(_point(point, build_id))
    found = []
    for device, metrics in sorted(by_device.items()):
        steps = []
        for metric, series in metrics.items():
            for label, points in series.items():
                points.sort(key=lambda p: p.time)
                step = find_step(points)
                if step is not None:
                    steps.append(StepChange(device, metric, label, step[0], step[1], step[2]))
        found.append(
            DeviceHistory(
                device, metrics, sorted(events[device].values(), key=lambda e: e.time), steps
            )
        )
    return found


def _point(pooled: Mapping[str, Any], build_id: str) -> Point:
    data, values = pooled["data"], pooled["values"]
    return Point(
        time=_text(data, "host_time"),
        median=statistics.median(values),
        low=min(values),
        high=max(values),
        samples=len(values),
        runs=len(pooled["runs"]),
        build_id=build_id,
        lock=_text(data, "build", "lock_sha256"),
        device=_text(data, "device", "name"),
        model_sha=_text(data, "model", "sha256"),
        commit=_text(data, "build", "build_commit"),
        variant=_text(data, "variant", "name"),
    )


def _mark_events(
    found: dict[tuple[str, str], Event],
    last_commit: dict[str, str],
    device: str,
    time: str,
    commit: str,
    variant: str,
    build_id: str,
) -> None:
    """Records arrive in time order: a new upstream commit on a device is a pin change."""
    if commit and commit != last_commit.get(device):
        if device in last_commit:
            found[(PIN, commit)] = Event(
                PIN,
                time,
                f"upstream {last_commit[device][:10]} -> {commit[:10]} (build {build_id[:12]})",
            )
        last_commit[device] = commit
    if variant:
        kind = PATCH if variant in PATCH_VARIANTS or variant.startswith(MINUS) else CANDIDATE
        found.setdefault(
            (kind, f"{variant}@{build_id}"), Event(kind, time, f"{variant} (build {build_id[:12]})")
        )


def find_step(points: Sequence[Point]) -> tuple[float, Point, Point] | None:
    """The largest change between two consecutive builds with STEP_WINDOW builds on each side all
    on their side of it, when it exceeds STEP_PCT: (change %, last before, first after)."""
    best: tuple[float, Point, Point] | None = None
    for i in range(STEP_WINDOW, len(points) - STEP_WINDOW + 1):
        before = [p.median for p in points[i - STEP_WINDOW : i]]
        after = [p.median for p in points[i : i + STEP_WINDOW]]
        if not (min(after) > max(before) or max(after) < min(before)):
            continue
        base = statistics.median(before)
        if not base:
            continue
        change = (statistics.median(after) - base) / base * 100.0
        if abs(change) > STEP_PCT and (best is None or abs(change) > abs(best[0])):
            best = (change, points[i - 1], points[i])
    return best


# --- drawing ---
MAX_POINTS = 150  # per series: more builds are drawn in buckets of consecutive builds
MAX_EVENTS = 150  # per kind of event and device


def thin(points: Sequence[Point], most: int = MAX_POINTS) -> list[Point]:
    """At most ``most`` points: consecutive builds pooled into one, named by their range, so
    the page stays small and quick to open however long the history is."""
    if len(points) <= most:
        return list(points)
    size = math.ceil(len(points) / most)
    return [_bucket(points[i : i + size]) for i in range(0, len(points), size)]


def _span(values: Sequence[str], width: int) -> str:
    first, last = values[0][:width], values[-1][:width]
    return first if first == last else f"{first}..{last}"


def _bucket(points: Sequence[Point]) -> Point:
    return Point(
        time=points[len(points) // 2].time,
        median=statistics.median(p.median for p in points),
        low=min(p.low for p in points),
        high=max(p.high for p in points),
        samples=sum(p.samples for p in points),
        runs=sum(p.runs for p in points),
        build_id=f"{_span([p.build_id for p in points], 12)} ({len(points)} builds)",
        lock=_span([p.lock for p in points], 16),
        device=points[0].device,
        model_sha=_span([p.model_sha for p in points], 16),
        commit=_span([p.commit for p in points], 12),
        variant=points[0].variant,
    )


def thin_events(events: Sequence[Event], most: int = MAX_EVENTS) -> list[Event]:
    """At most ``most`` events of each kind; consecutive ones merged into one mark."""
    found: list[Event] = []
    for kind in EVENT_ROWS:
        marks = [e for e in events if e.kind == kind]
        size = max(1, math.ceil(len(marks) / most))
        for i in range(0, len(marks), size):
            group = marks[i : i + size]
            more = f" (+{len(group) - 1} more to {group[-1].time})" if len(group) > 1 else ""
            found.append(Event(kind, group[0].time, group[0].text + more))
    return found


HOVER = (
    "%{y:.4g} (min %{customdata[6]:.4g}, max %{customdata[7]:.4g}; %{customdata[5]})<br>"
    "build %{customdata[0]}<br>lock %{customdata[1]}<br>device %{customdata[2]}<br>"
    "model sha256 %{customdata[3]}<br>upstream %{customdata[4]}<br>%{x}"
    "<extra>%{fullData.name}</extra>"
)
EVENT_ROWS = (PIN, CANDIDATE, PATCH)
EVENT_SYMBOLS = {PIN: "line-ns-open", CANDIDATE: "diamond", PATCH: "square"}


def figure(device: DeviceHistory) -> Any:
    """One figure per device: a row of events, then one row per metric, time on a shared axis."""
    from plotly.subplots import make_subplots

    metrics = sorted(device.series, key=lambda m: (m not in (PREFILL, DECODE), m != PREFILL, m))
    fig = make_subplots(
        rows=len(metrics) + 1,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.04,
        row_heights=[0.4] + [1.0] * len(metrics),
        subplot_titles=["events", *metrics],
    )
    events = thin_events(device.events)
    for kind in EVENT_ROWS:
        marks = [e for e in events if e.kind == kind]
        if marks:
            fig.add_scatter(
                x=[e.time for e in marks],
                y=[kind] * len(marks),
                mode="markers",
                name=kind,
                text=[e.text for e in marks],
                hovertemplate="%{text}<br>%{x}<extra></extra>",
                marker={"symbol": EVENT_SYMBOLS[kind], "size": 9},
                row=1,
                col=1,
            )
    for row, metric in enumerate(metrics, start=2):
        for label, every in sorted(device.series[metric].items()):
            points = thin(every)
            fig.add_scatter(
                x=[p.time for p in points],
                y=[p.median for p in points],
                mode="lines+markers",
                name=label,
                legendgroup=label,
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [p.high - p.median for p in points],
                    "arrayminus": [p.median - p.low for p in points],
                    "thickness": 1,
                    "width": 2,
                },
                customdata=[_provenance(p) for p in points],
                hovertemplate=HOVER,
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text=metric, row=row, col=1)
    for step in device.steps:
        row = metrics.index(step.metric) + 2
        fig.add_vrect(
            x0=step.before.time,
            x1=step.after.time,
            row=row,
            col=1,
            line_width=0,
            opacity=0.25,
            fillcolor="red" if step.change_pct < 0 else "green",
            annotation_text=f"{step.change_pct:+.1f}% {step.series}: "
            f"{step.before.commit[:10]}..{step.after.commit[:10]}",
            annotation_position="top left",
            annotation_font_size=10,
        )
    fig.update_layout(
        title=f"{device.device}",
        height=260 + 300 * len(metrics),
        hovermode="closest",
        legend={"font": {"size": 10}},
        margin={"l": 60, "r": 20, "t": 60, "b": 40},
    )
    return fig


def _short(value: str, width: int) -> str:
    """A hash cut to ``width``; a bucket's range of hashes is already cut."""
    return (value if ".." in value else value[:width]) or "-"


def _provenance(point: Point) -> list[object]:
    runs = f"{point.runs} run{'s' * (point.runs != 1)}, n={point.samples}"
    return [
        point.build_id,
        _short(point.lock, 16),
        point.device,
        _short(point.model_sha, 16),
        _short(point.commit, 12),
        runs,
        point.low,
        point.high,
    ]


PAGE_STYLE = (
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:2px 6px}"
)


# plotly's partial bundle of scatter, bar and pie traces, the only kind the report draws: a
# quarter of the full bundle's size and of its time to start in a browser. scripts/setup
# installs it from npm (package.json, package-lock.json) beside the source tree.
BASIC_BUNDLE = (
    Path(__file__).resolve().parents[2]
    / "node_modules"
    / "plotly.js-basic-dist-min"
    / "plotly-basic.min.js"
)


def plotly_js(basic: Path = BASIC_BUNDLE) -> str:
    """plotly.js for the page: the basic bundle when it is installed and is the version plotly's
    figures are made for, else the full bundle plotly ships (the same page, slower to open)."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    try:
        code = basic.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return str(get_plotlyjs())
    header = re.match(r"/\*\*\s*\* plotly\.js \(basic - minified\) v(\S+)\s", code)
    if header is None or header.group(1) != get_plotlyjs_version():
        return str(get_plotlyjs())
    return code


# Figures are drawn when they come near the window, so opening the page costs one figure
# however many devices it holds. Our code, not plotly's: plotly.js is inlined as it ships.
DRAW_NEAR = """<script>(() => {
  const draw = div => {
    const fig = JSON.parse(document.getElementById(div.id + '-figure').textContent);
    Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true});
  };
  const near = new IntersectionObserver(seen => seen.forEach(e => {
    if (e.isIntersecting) { near.unobserve(e.target); draw(e.target); }
  }), {rootMargin: '200px'});
  document.querySelectorAll('.kz-figure').forEach(div => near.observe(div));
})();</script>"""


def render(histories: Sequence[DeviceHistory], *, records: int) -> str:
    """The page: a table of the steps found, then each device's figure, drawn when it comes into
    view; plotly.js inlined once."""
    import plotly.io as pio

    if not histories:
        raise ResultsError(
            "nothing to report: there are no measured results", hint="run kzbuild bench"
        )
    made = datetime.now(timezone.utc).isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>kzbuild results report</title>"
        f"<style>{PAGE_STYLE}</style><script>{plotly_js()}</script></head>"
        "<body><h1>kzbuild results</h1>",
        f"<p>{records} records, {len(histories)} device(s); made {made}. "
        "Hover a point for its provenance.</p>",
        _steps_table([step for h in histories for step in h.steps]),
    ]
    for index, device in enumerate(histories):
        fig = figure(device)
        # "<" only in JSON strings, escaped: no text of a record can end the script element
        spec = pio.to_json(fig, validate=False).replace("<", "\\u003c")
        parts.append(
            f"<h2>{html.escape(device.device)}</h2>"
            f"<div id='device-{index}' class='kz-figure' style='height:{fig.layout.height}px'>"
            f"</div><script type='application/json' id='device-{index}-figure'>{spec}</script>"
        )
    parts.append(f"{DRAW_NEAR}</body></html>")
    return "\n".join(parts)


def _steps_table(steps: Sequence[StepChange]) -> str:
    if not steps:
        return "<p>No step change found.</p>"
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(cell)}</td>"
            for cell in (
                step.device,
                step.metric,
                step.series,
                f"{step.change_pct:+.1f}%",
                f"{step.before.commit[:10] or '?'}..{step.after.commit[:10] or '?'}",
                f"{step.before.build_id[:12]}..{step.after.build_id[:12]}",
                f"{step.before.time} .. {step.after.time}",
            )
        )
        + "</tr>"
        for step in sorted(steps, key=lambda s: s.change_pct)
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("device", "metric", "series", "change", "upstream commits", "builds", "between")
    )
    return f"<h2>Step changes</h2><table id='steps'><tr>{head}</tr>{rows}</table>"


def write_report(stored: Iterable[Mapping[str, Any]], out: Path) -> Path:
    """Write the report of every stored measured record to ``out``."""
    rows = list(stored)
    page = render(history(rows), records=len(rows))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, page.encode("utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"cannot write the report to {out}: {exc.strerror}",
            hint="-o names an HTML file in a writable folder",
        ) from None
    return out
