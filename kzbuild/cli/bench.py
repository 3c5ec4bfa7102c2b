"""``kzbuild run``, ``kzbuild bench`` and ``kzbuild results``."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kzbuild import bench, results
from kzbuild.cli.complete import complete_device, complete_run
from kzbuild.cli.ui import activity, console, context, not_empty, print_json
from kzbuild.devices.registry import connect, resolve_device
from kzbuild.errors import RegressionFound, ResultsError
from kzbuild.model.bench import OPTIONS_BY_NAME, BenchPoint, BenchSpec
from kzbuild.model.result import BenchRecord, Summary
from kzbuild.run import check_seconds, parse_env_assignments, run_tool
from kzbuild.settings import Settings

DeviceOpt = Annotated[Optional[str], typer.Option("--device", "-d", callback=not_empty, help="Device name, or adb:SERIAL[:ROOT], ssh://user@host:port/ROOT, local:/path. Default: local.", autocompletion=complete_device)]
EnvOpt = Annotated[Optional[list[str]], typer.Option("--env", "-e", help="NAME=VALUE added to the device env (repeatable); passed exactly, never through a shell unquoted.")]
TimeoutOpt = Annotated[Optional[float], typer.Option("--timeout", help="Seconds before the tool is killed.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
MarkdownOpt = Annotated[bool, typer.Option("--markdown", help="A markdown table instead of a rich one.")]
PASSTHROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False}

results_app = typer.Typer(help="Stored benchmark results: list, show, compare, plot, import the seed figures.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("run", context_settings=PASSTHROUGH)(run_command)
    app.command("bench", context_settings=PASSTHROUGH)(bench_command)
    app.add_typer(results_app, name="results")


def run_command(
    ctx: typer.Context,
    tool: Annotated[str, typer.Argument(callback=not_empty, help="A program of the current release's bin/, e.g. llama-cli.")],
    args: Annotated[Optional[list[str]], typer.Argument(help="Its arguments, passed exactly as given.")] = None,
    device: DeviceOpt = None,
    env: EnvOpt = None,
    timeout: TimeoutOpt = None,
) -> int:
    """Run TOOL from the device's current release with the device env; exits with the tool's code.

    Adds nothing: no threads, batch or env of its own. Everything after TOOL, options too, goes to the tool unchanged: kzbuild run llama-cli -m models/x.gguf -p hi
    """
    settings = context(ctx).settings
    check_seconds("--timeout", timeout)
    extra_env = parse_env_assignments(env or [])
    target = resolve_device(settings, device)
    transport = connect(target)
    try:
        return run_tool(
            settings, transport, target, tool, args or [], env=extra_env, timeout=timeout,
            on_stdout=_writer(sys.stdout), on_stderr=_writer(sys.stderr),
        )  # fmt: skip
    finally:
        transport.close()


def _writer(stream):  # type: ignore[no-untyped-def]
    def write(chunk: bytes) -> None:
        stream.buffer.write(chunk)
        stream.buffer.flush()

    return write


def bench_command(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", "-m", callback=not_empty, help="Model path on the device; relative paths start at the device root (models/...).")],
    extra: Annotated[Optional[list[str]], typer.Argument(help="More llama-bench arguments after --, passed as given.")] = None,
    device: DeviceOpt = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", callback=not_empty, help=OPTIONS_BY_NAME["p"].help)] = None,
    gen: Annotated[Optional[str], typer.Option("-n", "--gen", callback=not_empty, help=OPTIONS_BY_NAME["n"].help)] = None,
    ngl: Annotated[Optional[str], typer.Option("--ngl", callback=not_empty, help=OPTIONS_BY_NAME["ngl"].help)] = None,
    threads: Annotated[Optional[str], typer.Option("-t", "--threads", callback=not_empty, help=OPTIONS_BY_NAME["t"].help)] = None,
    batch: Annotated[Optional[str], typer.Option("-b", "--batch", callback=not_empty, help=OPTIONS_BY_NAME["b"].help)] = None,
    ubatch: Annotated[Optional[str], typer.Option("--ub", "--ubatch", callback=not_empty, help=OPTIONS_BY_NAME["ub"].help)] = None,
    dev: Annotated[Optional[str], typer.Option("--dev", callback=not_empty, help=OPTIONS_BY_NAME["dev"].help)] = None,
    repetitions: Annotated[Optional[str], typer.Option("-r", "--repetitions", callback=not_empty, help=OPTIONS_BY_NAME["r"].help)] = None,
    env: EnvOpt = None,
    sweep: Annotated[Optional[list[str]], typer.Option("--sweep", help="AXIS=V1,V2,... (p n ngl t b ub dev r, or env:NAME); several give their cartesian product.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", min=0, help="Seed of the randomized sweep order (default: fresh, recorded).")] = None,
    cooldown: Annotated[float, typer.Option("--cooldown", help="Seconds to wait between runs of a sweep.")] = 0.0,
    timeout: TimeoutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Run llama-bench -o json on the device and store one record per test with its provenance.

    Only the given options reach llama-bench (plus -o json and -m). Results go to results/results.sqlite3 and results/results.jsonl; logs to WORK/bench/RUN-ID/.
    """
    settings = context(ctx).settings
    given = {"p": prompt, "n": gen, "ngl": ngl, "t": threads, "b": batch, "ub": ubatch, "dev": dev, "r": repetitions}
    spec = BenchSpec(
        model=model,
        options=tuple((name, value) for name, value in given.items() if value is not None),
        env=tuple(parse_env_assignments(env or []).items()),
        extra_args=tuple(extra or ()),
        sweep=tuple(bench.parse_sweep(text) for text in sweep or ()),
        seed=seed,
        cooldown=cooldown,
        timeout=timeout,
    )
    bench.check_spec(spec)  # before connecting: a bad value is a usage error wherever the device is
    target = resolve_device(settings, device)
    transport = connect(target)
    try:
        with results.ResultsStore(settings.results) as store, activity(f"llama-bench on {target.name}") as progress:

            def on_point(point: BenchPoint) -> None:
                shown = " ".join(f"{k}={v}" for k, v in point.values)
                progress(f"run {point.index + 1}/{point.total} {shown}")

            def on_stderr(chunk: bytes) -> None:
                # str.strip also drops what bytes.strip keeps (\x1c, NBSP): a chunk of those has no lines
                lines = chunk.decode(errors="replace").strip().splitlines()
                progress(lines[-1] if lines else "")

            run = bench.bench(settings, transport, target, spec, store, on_point=on_point, on_stderr=on_stderr)
    finally:
        transport.close()
    if json_out:
        print_json({"run_id": run.run_id, "seed": run.seed, "logs": str(run.logs), "records": [_record_json(r) for r in run.records]})
        return
    _print_records(run.records, title=f"run {run.run_id} on {target.name}", markdown=False)
    _say(f"stored {len(run.records)} records as run {run.run_id} (sweep seed {run.seed}); logs in {run.logs}")


# --- results ---
@results_app.command("list")
def results_list(ctx: typer.Context, json_out: JsonOpt = False, markdown: MarkdownOpt = False) -> None:
    """List stored runs (measured and manual), oldest first."""
    settings = context(ctx).settings
    with results.ResultsStore(settings.results) as store:
        runs = store.runs()
    if json_out:
        print_json([run.__dict__ for run in runs])
        return
    elsewhere = results.elsewhere_hint(settings) if all(run.kind != "bench" for run in runs) else None
    if elsewhere:
        _say(f"hint: {elsewhere}")
    rows = [
        [run.run_id, run.kind, run.host_time, run.device, ", ".join(b[:12] for b in run.build_ids) or "-",
         ", ".join(run.models), " ".join(run.tests), str(run.records)]
        for run in runs
    ]  # fmt: skip
    _render("results", ["run", "kind", "time", "device", "build", "model", "tests", "records"], rows, markdown=markdown)


@results_app.command("show")
def results_show(
    ctx: typer.Context,
    selector: Annotated[str, typer.Argument(callback=not_empty, help="Run id or build id (a prefix is enough), or 'latest'.", autocompletion=complete_run)],
    json_out: JsonOpt = False,
    markdown: MarkdownOpt = False,
) -> None:
    """Show the records of a run or build: median and spread of the samples, with provenance."""
    settings = context(ctx).settings
    with results.ResultsStore(settings.results) as store, _pointing_elsewhere(store, settings):
        records = store.records(selector)
    if json_out:
        print_json([_record_json(r) for r in records])
        return
    _print_records(records, title=selector, markdown=markdown)
    first = records[0]
    if first.kind == "manual":
        _say(f"manual reference figures; source: {first.source.split(': ', 1)[-1]}")
        return
    _say(f"build {first.build.build_id} (recipe {first.build.recipe}, commit {first.build.build_commit})")
    _say(f"device {results.describe_device(first)}; model {first.model.path} sha256 {first.model.sha256}")
    _say(f"argv: {' '.join(first.argv)}")


@results_app.command("compare")
def results_compare(
    ctx: typer.Context,
    a: Annotated[str, typer.Argument(callback=not_empty, help="Baseline: run id or build id (prefix), or 'latest'.", autocompletion=complete_run)],
    b: Annotated[str, typer.Argument(callback=not_empty, help="Candidate: run id or build id (prefix), or 'latest'.", autocompletion=complete_run)],
    metric: Annotated[Optional[str], typer.Option("--metric", callback=not_empty, help="Only this test, e.g. pp512 or tg128.")] = None,
    threshold: Annotated[str, typer.Option("--threshold", callback=not_empty, help="A drop of B's median beyond this is a regression.")] = "5%",
    markdown: MarkdownOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Compare medians of B against A, test by test; exits 9 when B regresses past the threshold.

    Only results of the same device, model, env set and configuration are paired; when nothing pairs, it says what differs and compares nothing.
    """
    limit = results.parse_threshold(threshold)
    settings = context(ctx).settings
    with results.ResultsStore(settings.results) as store, _pointing_elsewhere(store, settings):
        comparison = results.compare(store.records(a), store.records(b), a_label=a, b_label=b, metric=metric, threshold_pct=limit)
    if json_out:
        print_json(_comparison_json(comparison))
    else:
        _print_comparison(comparison, markdown=markdown)
    if comparison.regressions:
        worst = min(row.change_pct or 0.0 for row in comparison.regressions)
        raise RegressionFound(f"{len(comparison.regressions)} test(s) of {b} regressed past {limit:g}% against {a} (worst {worst:+.1f}%)")


@results_app.command("plot")
def results_plot(
    ctx: typer.Context,
    selectors: Annotated[Optional[list[str]], typer.Argument(help="Runs or builds to plot (default: every measured result).")] = None,
    axis: Annotated[str, typer.Option("--axis", callback=not_empty, help="build, or a sweep axis: p n ngl t b ub dev, env:NAME.")] = "build",
    metric: Annotated[Optional[str], typer.Option("--metric", callback=not_empty, help="Only this test, e.g. pp512.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="PNG file to write (default: results/plot.png).")] = None,
) -> None:
    """Write a PNG of prefill and decode throughput over builds, or along one sweep axis."""
    settings = context(ctx).settings
    with results.ResultsStore(settings.results) as store, _pointing_elsewhere(store, settings):
        # Manual reference rows are drawn only when selected by name: they come from other devices.
        records = [r for s in selectors for r in store.records(s)] if selectors else [r for r in store.records() if r.kind == "bench"]
        written = results.plot(records, out or settings.results / "plot.png", axis=axis, metric=metric)
    _say(f"wrote {written}")


@results_app.command("import-seed")
def results_import_seed(
    ctx: typer.Context,
    path: Annotated[Optional[Path], typer.Argument(help="A seed YAML or a results JSONL (default: results/seed-*.yaml).")] = None,
) -> None:
    """Import historical figures (manual rows that name their source) or another results export."""
    settings = context(ctx).settings
    with results.ResultsStore(settings.results) as store:
        paths = [path] if path else sorted(settings.results.glob(results.SEED_GLOB))
        for item in paths:
            added = store.import_file(item)
            _say(f"{item}: {added} new records")


@contextmanager
def _pointing_elsewhere(store: results.ResultsStore, settings: Settings) -> Iterator[None]:
    """A selection that fails in a results dir without measured results names the dirs that hold some."""
    try:
        yield
    except ResultsError as exc:
        elsewhere = None if store.has_measurements() else results.elsewhere_hint(settings)
        if elsewhere is None:
            raise
        raise ResultsError(exc.message, hint=elsewhere) from exc


# --- rendering ---
def _record_json(record: BenchRecord) -> dict[str, object]:
    return record.to_dict() | {"record_id": record.record_id}


def _say(text: str) -> None:
    """A plain line: paths, argv and env values are shown as they are, never as markup."""
    console.print(text, markup=False, soft_wrap=True)


ID_COLUMNS = ("run", "build")


def _render(table_title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool) -> None:
    if markdown:
        lines = [f"**{table_title}**", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        _say("\n".join(lines))
        return
    table = Table(title=escape(table_title))
    for header in headers:
        # a narrow terminal wraps cells instead of cutting them; ids stay whole on one line, to be copied
        table.add_column(header, overflow="fold", no_wrap=header in ID_COLUMNS)
    for row in rows:
        table.add_row(*(escape(cell) for cell in row), style="red" if "regression" in row else None)
    console.print(table)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _median(record_or_group: BenchRecord | results.Group) -> str:
    summary = record_or_group.summary
    if summary.median is None and isinstance(record_or_group, BenchRecord) and record_or_group.range_ts:
        low, high = record_or_group.range_ts
        return f"{low:g}-{high:g}"
    return _fmt(summary.median)


def _spread(summary: Summary) -> str:
    if summary.spread_pct is None:
        return "-"
    return f"{summary.spread_pct:.1f}% (n={summary.n})" + (" !" if results.is_noisy(summary) else "")


def _spread_footnote(summaries: Sequence[Summary]) -> None:
    """What the spread column means, and what to do about the rows it flags."""
    if all(summary.spread_pct is None for summary in summaries):
        return
    _say("spread: (max - min) of the samples as % of their median; n: samples")
    noisy = sum(1 for summary in summaries if results.is_noisy(summary))
    if noisy:
        _say(
            f"!: {noisy} spread(s) above {results.NOISY_SPREAD_PCT:g}%: too noisy to trust small differences; "
            "raise -r (more repetitions) or add --cooldown SECONDS between runs"
        )


def _print_records(records: Sequence[BenchRecord], *, title: str, markdown: bool) -> None:
    varying = results.varying_env(records)
    rows = [
        [
            r.test, r.device.name, r.model.name or r.model.path, results.describe_config(r),
            results.describe_env((k, v) for k, v in r.env_set if k in varying), _median(r), r.unit, _spread(r.summary),
        ]
        for r in records
    ]  # fmt: skip
    _render(title, ["test", "device", "model", "config", "env", "median", "unit", "spread"], rows, markdown=markdown)
    _spread_footnote([r.summary for r in records])


def _print_comparison(comparison: results.Comparison, *, markdown: bool) -> None:
    groups = [g.first for row in comparison.rows for g in (row.a, row.b)]
    varying = results.varying_env(groups)
    rows = []
    for row in comparison.rows:
        first = row.a.first
        rows.append(
            [
                first.test, first.device.name, results.describe_config(first),
                results.describe_env((k, v) for k, v in first.env_set if k in varying),
                _fmt(row.a.summary.median), _spread(row.a.summary), _fmt(row.b.summary.median), _spread(row.b.summary),
                "-" if row.change_pct is None else f"{row.change_pct:+.1f}%", row.verdict,
            ]
        )  # fmt: skip
    title = f"{comparison.b_label} vs {comparison.a_label} (threshold {comparison.threshold_pct:g}%)"
    _render(title, ["test", "device", "config", "env", "A median", "A spread", "B median", "B spread", "change", "verdict"], rows, markdown=markdown)
    _spread_footnote([group.summary for row in comparison.rows for group in (row.a, row.b)])
    for label, unpaired in (("only in A", comparison.only_a), ("only in B", comparison.only_b)):
        for group in unpaired:
            _say(f"not compared ({label}): {group.first.test} {group.first.device.name} {results.describe_config(group.first)}")


def _comparison_json(comparison: results.Comparison) -> dict[str, object]:
    def side(group: results.Group) -> dict[str, object]:
        s = group.summary
        return {"median": s.median, "low": s.low, "high": s.high, "n": s.n, "records": [r.record_id for r in group.records]}

    return {
        "a": comparison.a_label,
        "b": comparison.b_label,
        "threshold_pct": comparison.threshold_pct,
        "metric": comparison.metric,
        "rows": [
            {"test": row.a.first.test, "device": row.a.first.device.name, "config": dict(row.a.first.config),
             "env": dict(row.a.first.env_set), "a": side(row.a), "b": side(row.b), "change_pct": row.change_pct, "verdict": row.verdict}
            for row in comparison.rows
        ],  # fmt: skip
        "only_a": [g.first.record_id for g in comparison.only_a],
        "only_b": [g.first.record_id for g in comparison.only_b],
    }
