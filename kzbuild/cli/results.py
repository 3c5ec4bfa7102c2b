"""``kzbuild results``: list, show, compare and plot stored benchmark results."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from kzbuild.adapters.settings import Settings
from kzbuild.cli import ui
from kzbuild.cli.complete import complete_run
from kzbuild.cli.memoryview import (
    COMPARED_MEMORY_HEADERS,
    MEMORY_HEADERS,
    check_budget,
    check_memory_regressions,
    compared_memory_cells,
    compared_memory_json,
    memory_cells,
    memory_json,
    parse_turn,
    print_turn,
    provenance_records,
    show_provenance,
    turn_json,
)
from kzbuild.cli.options import JsonOpt, MarkdownOpt
from kzbuild.cli.ui import (
    Column,
    command_group,
    context,
    not_empty,
    print_json,
    say,
    say_grid,
    say_rich_table,
    stdout_is_terminal,
)
from kzbuild.errors import BadRecord, ConfigError, RegressionFound, ResultsError
from kzbuild.measure import compare, report, resultfiles, resultplot, resultsdb
from kzbuild.measure.turn import turn_time
from kzbuild.model.result import MEASURED_KINDS, BenchRecord, Comparison, Group, Summary
from kzbuild.model.turn import TurnTime

SELECTOR_HELP = "Run id or build id (a prefix is enough), or 'latest'."
PROVENANCE_HELP = "Instead of SELECTOR: every part of this provenance id, and its records."
TURN_HELP = "PROMPT:GENERATE, e.g. 512:64: TTFT and the whole turn from the best pp and tg shown."
MEMORY_THRESHOLD_HELP = "A rise of B's median peak memory beyond this is a regression too."
results_app = command_group(
    "results", "Stored benchmark results: list, show, compare, plot, report, import, check, merge."
)


def register(app: typer.Typer) -> None:
    app.add_typer(results_app, name="results")


@results_app.command("list")
def results_list(
    ctx: typer.Context, json_out: JsonOpt = False, markdown: MarkdownOpt = False
) -> None:
    """List stored runs (measured and manual), oldest first."""
    settings = context(ctx).settings
    with _reading(settings) as store:
        runs = store.runs()
    if json_out:
        print_json([run.__dict__ for run in runs])
        return
    elsewhere = (
        resultfiles.elsewhere_hint(settings)
        if all(run.kind not in MEASURED_KINDS for run in runs)
        else None
    )
    if elsewhere:
        say(f"hint: {elsewhere}")
    rows = [
        [
            run.run_id,
            run.kind,
            run.host_time,
            run.device,
            ", ".join(b[:12] for b in run.build_ids) or "-",
            ", ".join(run.models),
            " ".join(run.tests),
            str(run.records),
        ]
        for run in runs
    ]
    _render(
        "results",
        ["run", "kind", "time", "device", "build", "model", "tests", "records"],
        rows,
        markdown=markdown,
    )


@results_app.command("show")
def results_show(
    ctx: typer.Context,
    selector: Annotated[
        Optional[str],
        typer.Argument(callback=not_empty, help=SELECTOR_HELP, autocompletion=complete_run),
    ] = None,
    provenance: Annotated[
        Optional[str], typer.Option("--provenance", callback=not_empty, help=PROVENANCE_HELP)
    ] = None,
    turn: Annotated[
        Optional[str], typer.Option("--turn", callback=not_empty, help=TURN_HELP)
    ] = None,
    json_out: JsonOpt = False,
    markdown: MarkdownOpt = False,
) -> None:
    """Show the records of a run or build: median and spread of the samples, peak memory and
    buffers, with provenance; exits 15 when a run was over its plan's memory limits."""
    settings = context(ctx).settings
    if (selector is None) == (provenance is None):
        raise ConfigError("give a run or build (SELECTOR) or --provenance ID, one of them")
    asked = parse_turn(turn) if turn is not None else None  # a usage error before anything is read
    with _reading(settings) as store:
        if selector is not None:
            records = store.records(selector)
        else:
            records = provenance_records(store.records(), provenance or "")
    if provenance is not None:
        show_provenance(records, provenance, json_out=json_out)
        return
    turned = turn_time(records, records, prompt=asked[0], generate=asked[1]) if asked else None
    with resultsdb.gc_paused():  # a row per record, acyclic
        if json_out:
            shown = [record_json(r) for r in records]
            print_json({"records": shown, "turn": turn_json(turned)} if turned else shown)
        else:
            print_details(records, selector or "", turned, markdown=markdown)
    check_budget(records)


def print_details(
    records: Sequence[BenchRecord], title: str, turned: TurnTime | None, *, markdown: bool
) -> None:
    print_records(records, title=title, markdown=markdown)
    first = records[0]
    if turned:
        print_turn("", turned)
    if first.kind == "manual":
        say(f"manual reference figures; source: {first.source.split(': ', 1)[-1]}")
        return
    say(
        f"build {first.build.build_id} (recipe {first.build.recipe}, commit "
        f"{first.build.build_commit})"
    )
    say(
        f"device {compare.describe_device(first)}; model {first.model.path} sha256 "
        f"{first.model.sha256}"
    )
    say(f"argv: {' '.join(first.argv)}")
    ids = sorted({r.provenance.id for r in records if r.provenance})
    if ids:
        say(f"provenance: {', '.join(ids)} (kzbuild results show --provenance ID lists its parts)")


@results_app.command("compare")
def results_compare(
    ctx: typer.Context,
    a: Annotated[
        str,
        typer.Argument(
            callback=not_empty,
            help="Baseline: run id or build id (prefix), or 'latest'.",
            autocompletion=complete_run,
        ),
    ],
    b: Annotated[
        str,
        typer.Argument(
            callback=not_empty,
            help="Candidate: run id or build id (prefix), or 'latest'.",
            autocompletion=complete_run,
        ),
    ],
    metric: Annotated[
        Optional[str],
        typer.Option("--metric", callback=not_empty, help="Only this test, e.g. pp512 or tg128."),
    ] = None,
    threshold: Annotated[
        str,
        typer.Option(
            "--threshold",
            callback=not_empty,
            help="A drop of B's median beyond this is a regression.",
        ),
    ] = "5%",
    memory_threshold: Annotated[
        str, typer.Option("--memory-threshold", callback=not_empty, help=MEMORY_THRESHOLD_HELP)
    ] = "5%",
    markdown: MarkdownOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Compare medians of B against A, test by test, with their peak memory; exits 9 when B
    regresses past the threshold (slower, or more memory).

    Only results of the same device, model, env set and configuration are paired; when nothing
    pairs, it says what differs and compares nothing.
    """
    limit = compare.parse_threshold(threshold)
    memory_limit = compare.parse_threshold(memory_threshold)
    settings = context(ctx).settings
    with _reading(settings) as store:
        comparison = compare.compare(
            store.records(a),
            store.records(b),
            a_label=a,
            b_label=b,
            metric=metric,
            threshold_pct=limit,
            memory_threshold_pct=memory_limit,
        )
    if json_out:
        print_json(_comparison_json(comparison))
    else:
        _print_comparison(comparison, markdown=markdown)
    if comparison.regressions:
        worst = min(row.change_pct or 0.0 for row in comparison.regressions)
        raise RegressionFound(
            f"{len(comparison.regressions)} test(s) of {b} regressed past {limit:g}% against {a} "
            f"(worst {worst:+.1f}%)"
        )
    check_memory_regressions(comparison, a, b)


@results_app.command("plot")
def results_plot(
    ctx: typer.Context,
    selectors: Annotated[
        Optional[list[str]],
        typer.Argument(help="Runs or builds to plot (default: every measured result)."),
    ] = None,
    axis: Annotated[
        str,
        typer.Option(
            "--axis",
            callback=not_empty,
            help="build, or a sweep axis: p n ngl t b ub dev, env:NAME.",
        ),
    ] = "build",
    metric: Annotated[
        Optional[str],
        typer.Option("--metric", callback=not_empty, help="Only this test, e.g. pp512."),
    ] = None,
    out: Annotated[
        Optional[Path],
        typer.Option("--out", "-o", help="PNG file to write (default: results/plot.png)."),
    ] = None,
) -> None:
    """Write a PNG of prefill and decode throughput over builds, or along one sweep axis."""
    settings = context(ctx).settings
    with _reading(settings) as store:
        # Manual reference rows are drawn only when selected by name: they come from other devices.
        records = (
            [r for s in selectors for r in store.records(s)]
            if selectors
            else [r for r in store.records() if r.kind == "bench"]
        )
        written = resultplot.plot(
            records, out or store.folder / "plot.png", axis=axis, metric=metric
        )
    say(f"wrote {written}")


@results_app.command("import-seed")
def results_import_seed(
    ctx: typer.Context,
    path: Annotated[
        Optional[Path],
        typer.Argument(help="A seed YAML or a results JSONL (default: results/seed-*.yaml)."),
    ] = None,
) -> None:
    """Import historical figures (manual rows that name their source) or another results export."""
    settings = context(ctx).settings
    with resultsdb.ResultsStore(settings.results) as store:
        paths = [path] if path else sorted(settings.results.glob(resultfiles.SEED_GLOB))
        for item in paths:
            added = store.import_file(item)
            say(f"{item}: {added} new records")


@results_app.command("report")
def results_report(
    ctx: typer.Context,
    out: Annotated[
        Optional[Path],
        typer.Option("--out", "-o", help="HTML file to write (default: results/report.html)."),
    ] = None,
) -> None:
    """Write one self-contained HTML file: every device's prefill, decode, memory and quality over
    time.

    Upstream pin changes, roll candidates and patch variants are marked, step changes shaded with
    their commit range; hovering a point shows its build, lock, device and model. No network needed.
    """
    settings = context(ctx).settings
    with _reading(settings) as store:
        written = report.write_report(store.stored(), out or store.folder / report.REPORT_FILE)
    say(f"wrote {written}")


@results_app.command("check")
def results_check(ctx: typer.Context) -> None:
    """Read every shard and seed file line by line and list each line the database refuses, and why;
    exits 13 if any."""
    settings = context(ctx).settings
    refused = [
        item
        for path in resultfiles.sources(settings.results)
        if path.suffix == ".jsonl"
        for item in resultfiles.check_file(path)
    ]
    for item in refused:
        say(f"refused {item.where}: {item.reason}")
    if refused:
        raise BadRecord(
            f"{len(refused)} line(s) refused in {settings.results}", hint=resultfiles.JSONL_HINT
        )
    with resultsdb.ResultsStore(settings.results) as store:  # seed files are checked as they load
        say(f"{settings.results}: every line reads as a record; {len(store.runs())} runs stored")


@results_app.command("merge")
def results_merge(ctx: typer.Context) -> None:
    """Resolve a git merge conflict in the shards as the union of both sides, then sort and dedupe
    them."""
    settings = context(ctx).settings
    merged = resultfiles.merge_shards(settings.results)
    with resultsdb.ResultsStore(settings.results) as store:
        for item in merged:
            if item.conflicts or item.duplicates:
                say(
                    f"{item.path.name}: {item.conflicts} conflict(s) resolved, {item.duplicates} "
                    "repeated line(s) dropped"
                )
        say(
            f"{len(merged)} shard(s) merged; {len(store.runs())} runs stored; git add "
            f"{settings.results} to finish a merge"
        )


@contextmanager
def _reading(settings: Settings) -> Iterator[resultsdb.ResultsStore]:
    """The store the reading commands use, saying where it is when it is not the one in use; a
    selection that fails in a results dir without measured results names the dirs that hold some."""
    folder, note = resultfiles.reading_dir(settings)
    if note:
        ui.say(note, err=True)
    with resultsdb.ResultsStore(folder) as store:
        try:
            yield store
        except ResultsError as exc:
            elsewhere = None if store.has_measurements() else resultfiles.elsewhere_hint(settings)
            if elsewhere is None:
                raise
            raise ResultsError(exc.message, hint=elsewhere) from exc


# --- rendering ---
def record_json(record: BenchRecord) -> dict[str, object]:
    return record.to_dict() | {"record_id": record.record_id} | memory_json(record.memory)


ID_COLUMNS = ("run", "build")


def _render(
    table_title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool
) -> None:
    if markdown:
        lines = [
            f"**{table_title}**",
            "",
            "| " + " | ".join(headers) + " |",
            "|" + "---|" * len(headers),
        ]
        lines += [
            "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows
        ]
        say("\n".join(lines))
        return
    if not stdout_is_terminal():  # a pipe or a file: plain lines, every cell whole
        say_grid(table_title, headers, rows, alert="regression")
        return
    say_rich_table(
        # a narrow terminal wraps cells instead of cutting them; ids stay whole on one
        # line, to be copied
        [Column(header, fold=True, whole=header in ID_COLUMNS) for header in headers],
        rows,
        title=table_title,
        row_styles=[
            "red" if "regression" in row or any(cell.startswith("OVER ") for cell in row) else None
            for row in rows
        ],
    )


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _median(record_or_group: BenchRecord | Group) -> str:
    summary = record_or_group.summary
    if (
        summary.median is None
        and isinstance(record_or_group, BenchRecord)
        and record_or_group.range_ts
    ):
        low, high = record_or_group.range_ts
        return f"{low:g}-{high:g}"
    return _fmt(summary.median)


def _spread(summary: Summary) -> str:
    if summary.spread_pct is None:
        return "-"
    return f"{summary.spread_pct:.1f}% (n={summary.n})" + (
        " !" if compare.is_noisy(summary) else ""
    )


def _spread_footnote(summaries: Sequence[Summary]) -> None:
    """What the spread column means, and what to do about the rows it flags."""
    if all(summary.spread_pct is None for summary in summaries):
        return
    say("spread: (max - min) of the samples as % of their median; n: samples")
    noisy = sum(1 for summary in summaries if compare.is_noisy(summary))
    if noisy:
        say(
            f"!: {noisy} spread(s) above {compare.NOISY_SPREAD_PCT:g}%: too noisy to trust small "
            "differences; "
            "raise -r (more repetitions) or add --cooldown SECONDS between runs"
        )


def print_records(records: Sequence[BenchRecord], *, title: str, markdown: bool) -> None:
    varying = compare.varying_env(records)
    rows = [
        [
            r.test,
            r.device.name,
            r.model.name or r.model.path,
            compare.describe_config(r),
            compare.describe_env((k, v) for k, v in r.env_set if k in varying),
            _median(r),
            r.unit,
            _spread(r.summary),
            *memory_cells(r.memory),
        ]
        for r in records
    ]
    headers = ["test", "device", "model", "config", "env", "median", "unit", "spread"]
    _render(title, [*headers, *MEMORY_HEADERS], rows, markdown=markdown)
    _spread_footnote([r.summary for r in records])


def _print_comparison(comparison: Comparison, *, markdown: bool) -> None:
    groups = [g.first for row in comparison.rows for g in (row.a, row.b)]
    varying = compare.varying_env(groups)
    rows = []
    for row in comparison.rows:
        first = row.a.first
        rows.append(
            [
                first.test,
                first.device.name,
                compare.describe_config(first),
                compare.describe_env((k, v) for k, v in first.env_set if k in varying),
                _fmt(row.a.summary.median),
                _spread(row.a.summary),
                _fmt(row.b.summary.median),
                _spread(row.b.summary),
                "-" if row.change_pct is None else f"{row.change_pct:+.1f}%",
                row.verdict,
                *compared_memory_cells(row),
            ]
        )
    limits = f"threshold {comparison.threshold_pct:g}%, memory {comparison.memory_threshold_pct:g}%"
    title = f"{comparison.b_label} vs {comparison.a_label} ({limits})"
    headers = ["test", "device", "config", "env", "A median", "A spread", "B median", "B spread"]
    headers += ["change", "verdict", *COMPARED_MEMORY_HEADERS]
    _render(title, headers, rows, markdown=markdown)
    _spread_footnote([group.summary for row in comparison.rows for group in (row.a, row.b)])
    for label, unpaired in (("only in A", comparison.only_a), ("only in B", comparison.only_b)):
        for group in unpaired:
            say(
                f"not compared ({label}): {group.first.test} {group.first.device.name} "
                f"{compare.describe_config(group.first)}"
            )


def _comparison_json(comparison: Comparison) -> dict[str, object]:
    def side(group: Group) -> dict[str, object]:
        s = group.summary
        return {
            "median": s.median,
            "low": s.low,
            "high": s.high,
            "n": s.n,
            "records": [r.record_id for r in group.records],
        }

    return {
        "a": comparison.a_label,
        "b": comparison.b_label,
        "threshold_pct": comparison.threshold_pct,
        "memory_threshold_pct": comparison.memory_threshold_pct,
        "metric": comparison.metric,
        "rows": [
            {
                "test": row.a.first.test,
                "device": row.a.first.device.name,
                "config": dict(row.a.first.config),
                "env": dict(row.a.first.env_set),
                "a": side(row.a),
                "b": side(row.b),
                "change_pct": row.change_pct,
                "verdict": row.verdict,
                "memory": compared_memory_json(row),
            }
            for row in comparison.rows
        ],
        "only_a": [g.first.record_id for g in comparison.only_a],
        "only_b": [g.first.record_id for g in comparison.only_b],
    }
