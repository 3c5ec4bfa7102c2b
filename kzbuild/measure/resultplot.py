"""PNG plots of stored results: prefill and decode medians over builds or along a sweep axis."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kzbuild.errors import ConfigError, ResultsError
from kzbuild.measure.compare import describe_config, describe_env, unique, varying_env
from kzbuild.model.bench import ENV_AXIS_PREFIX, OPTIONS_BY_NAME
from kzbuild.model.result import BenchRecord, Group

PLOT_AXES = ("build", *(o.name for o in OPTIONS_BY_NAME.values() if o.field))


def axis_value(record: BenchRecord, axis: str) -> str | None:
    if axis in record.sweep.point:
        return record.sweep.point[axis]
    if axis.startswith(ENV_AXIS_PREFIX):
        return record.env.get(axis.removeprefix(ENV_AXIS_PREFIX))
    option = OPTIONS_BY_NAME.get(axis)
    if option is None or not option.field:
        raise ConfigError(
            f"cannot plot along '{axis}'", hint=f"axes: {', '.join(PLOT_AXES)}, env:NAME"
        )
    value = record.raw.get(option.field, record.config.get(option.field))
    return None if value is None else str(value)


def plot(
    records: Sequence[BenchRecord], out: Path, *, axis: str = "build", metric: str | None = None
) -> Path:
    """Write a PNG: prefill and decode throughput, each sample and their median, along builds
    or one sweep axis.

    Manual reference rows are drawn as dashed lines. Series never mix devices, models or env.
    """
    measured = [r for r in records if r.kind == "bench" and (metric is None or r.test == metric)]
    references = [
        r
        for r in records
        if r.kind == "manual"
        and r.unit == "t/s"
        and (metric is None or _panel(r.test) == _panel(metric))
    ]
    if not measured:
        raise ResultsError(
            "nothing to plot: the selection has no measured results"
            + (f" for {metric}" if metric else "")
        )
    if axis != "build":
        axis_value(measured[0], axis)  # rejects an unknown axis before any drawing

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # constrained layout keeps titles, tick labels and legends from running into each other
    figure, panels = plt.subplots(2, 1, figsize=(10, 9), squeeze=False, layout="constrained")
    panel_of = {"prefill": panels[0][0], "decode": panels[1][0]}
    builds = unique(r.build.build_id or "?" for r in measured)
    for name, axes in panel_of.items():
        axes.set_title(f"{name} ({'over builds' if axis == 'build' else 'along ' + axis})")
        axes.set_ylabel("tokens/s (dots: samples; line: median)")
        axes.set_xlabel("build" if axis == "build" else axis)
        axes.grid(True, alpha=0.3)
    for label, points in _series(measured, axis, builds).items():
        axes = panel_of[_panel(label[0])]
        medians = [math.nan if g.summary.median is None else g.summary.median for _, g in points]
        xs = [x for x, _ in points]
        (line,) = axes.plot(xs, medians, marker="_", markersize=24, mew=2, label=label[1])
        for x, group in points:
            samples = [s for r in group.records for s in r.samples_ts]
            samples = samples or [r.avg_ts for r in group.records if r.avg_ts is not None]
            at: list[float | int | str] = [x] * len(samples)
            if axis == "build" and isinstance(x, int):  # side by side: equal samples stay apart
                at = [x + 0.05 * (i - (len(samples) - 1) / 2) for i in range(len(samples))]
            axes.scatter(at, samples, s=18, alpha=0.7, color=line.get_color(), zorder=3)
    for record in references:
        axes = panel_of[_panel(record.test)]
        reference_label = (
            f"{record.label or record.test}: {record.device.name} {record.model.name} (manual)"
        )
        if record.avg_ts is not None:
            axes.axhline(
                record.avg_ts, linestyle="--", linewidth=1, color="gray", label=reference_label
            )
        elif record.range_ts:
            axes.axhspan(*record.range_ts, alpha=0.1, color="gray", label=reference_label)
    if axis == "build":
        for axes in panel_of.values():
            axes.set_xticks(
                range(len(builds)), [b[:12] for b in builds], rotation=30, ha="right", fontsize=8
            )
            axes.set_xlim(-0.5, len(builds) - 0.5)
    for axes in panel_of.values():
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), markerscale=0.5)
    return save_png(figure, out, option="--out")


def save_png(figure: Any, out: Path, *, option: str) -> Path:
    """Write a matplotlib figure to ``out`` (named by ``option``) and free it."""
    import matplotlib.pyplot as plt

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out, format="png", dpi=100, bbox_inches="tight")
    except OSError as exc:
        raise ConfigError(
            f"cannot write the plot to {out}: {exc.strerror}",
            hint=f"{option} names a PNG file in a writable folder",
        ) from None
    finally:
        plt.close(figure)
    return out


def _panel(test: str) -> str:
    return "decode" if "tg" in test else "prefill"


def _series(
    records: Sequence[BenchRecord], axis: str, builds: Sequence[str]
) -> dict[tuple[str, str], list[tuple[float | int | str, Group]]]:
    """(test, legend label) -> points (x, its records); a series per group of records that
    compare, minus the axis."""
    grouped: dict[tuple[object, ...], list[BenchRecord]] = defaultdict(list)
    xs: dict[tuple[object, ...], dict[object, list[BenchRecord]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for record in records:
        if axis == "build":
            x: object = builds.index(record.build.build_id or "?")
            key = record.group_key
        else:
            x = axis_value(record, axis)
            key = (record.build.build_id, *_without_axis(record, axis))
        grouped[key].append(record)
        xs[key][x].append(record)
    series = {}
    # one kind of x per plot: matplotlib cannot put numbers and text (auto, unset) on one axis
    numeric = all(_axis_number(x) is not None for by_x in xs.values() for x in by_x)
    shown_env = varying_env(records) - {axis.removeprefix(ENV_AXIS_PREFIX)}
    skip = OPTIONS_BY_NAME[axis].field if axis in OPTIONS_BY_NAME else ""
    for key, items in grouped.items():
        first = items[0]
        label = " ".join(
            part
            for part in (
                first.test if axis not in ("p", "n") else "",
                first.device.name,
                first.model.name or Path(first.model.path).name or (first.model.sha256 or "")[:8],
                describe_config(first, skip=skip),
                describe_env((k, v) for k, v in first.env_set if k in shown_env),
                f"build {(first.build.build_id or '')[:12]}" if axis != "build" else "",
            )
            if part
        )
        points: list[tuple[float | int | str, Group]] = []
        for x, rs in xs[key].items():
            number = _axis_number(x)
            at = number if numeric and number is not None else str(x)
            points.append((at, Group(key, tuple(rs))))
        points.sort(
            key=lambda p: (
                isinstance(p[0], str),
                p[0] if not isinstance(p[0], str) else 0,
                str(p[0]),
            )
        )
        series[(first.test, label)] = points
    return series


def _without_axis(record: BenchRecord, axis: str) -> tuple[object, ...]:
    env_set, test, config_key = record.env_set, record.test, record.config_key
    if axis.startswith(ENV_AXIS_PREFIX):
        name = axis.removeprefix(ENV_AXIS_PREFIX)
        env_set = tuple(item for item in env_set if item[0] != name)
    elif axis in ("p", "n"):
        test = "pp" if "pp" in test else "tg"
    else:
        field = OPTIONS_BY_NAME[axis].field
        config_key = tuple(item for item in config_key if item[0] != field)
    return (record.device.key, record.model.key, env_set, test, config_key, record.unit)


def _axis_number(value: object) -> float | int | None:
    """The value as a finite number when its text is one (``4``, ``1e3``); None for ``auto``,
    ``nan``, None."""
    text = str(value)
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return number if math.isfinite(number) else None
    return None
