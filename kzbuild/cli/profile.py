"""``kzbuild profile``: per-op time of prefill and decode, on a device or from a saved log."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Optional

import typer

from kzbuild.cli.complete import complete_recipe
from kzbuild.cli.connect import open_device
from kzbuild.cli.options import DeviceOpt, EnvOpt, JsonOpt, TimeoutOpt
from kzbuild.cli.ui import (
    Column,
    activity,
    context,
    not_empty,
    print_json,
    say,
    say_rich_table,
)
from kzbuild.device.run import parse_env_assignments
from kzbuild.errors import ConfigError
from kzbuild.measure import profiling
from kzbuild.model.profile import NO_LAYER, ComparedOp, PhaseProfile, ProfileRecord, ProfileSpec


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_command)


def profile_command(
    ctx: typer.Context,
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            "-m",
            callback=not_empty,
            help="Model path on the device; relative paths start at the device root.",
        ),
    ] = None,
    device: DeviceOpt = None,
    prompt: Annotated[
        int, typer.Option("-p", "--prompt", help="Prompt tokens of the prefill.")
    ] = 512,
    gen: Annotated[
        int,
        typer.Option(
            "-n", "--gen", help="Tokens decoded one by one after it (0: no decode phase)."
        ),
    ] = 16,
    ubatch: Annotated[
        Optional[int],
        typer.Option("--ub", "--ubatch", help="Physical batch size (default: llama.cpp's)."),
    ] = None,
    threads: Annotated[
        Optional[int], typer.Option("-t", "--threads", help="CPU threads (default: llama.cpp's).")
    ] = None,
    ngl: Annotated[
        Optional[int],
        typer.Option("--ngl", help="Layers offloaded to the accelerator (default: llama.cpp's)."),
    ] = None,
    dev: Annotated[
        Optional[str],
        typer.Option(
            "--dev", callback=not_empty, help="llama.cpp devices, e.g. HTP0 or none (CPU only)."
        ),
    ] = None,
    repetitions: Annotated[
        int,
        typer.Option("-r", "--repetitions", help="Repetitions (each runs plain and timed once)."),
    ] = 1,
    env: EnvOpt = None,
    timeout: TimeoutOpt = None,
    by: Annotated[
        str, typer.Option("--by", help="op: per op type; layer: per layer and op type.")
    ] = "op",
    from_log: Annotated[
        Optional[Path],
        typer.Option(
            "--from-log",
            help="Read ggml-hexagon profile-op lines from this saved log instead of running.",
        ),
    ] = None,
    recipe: Annotated[
        Optional[str],
        typer.Option(
            "--recipe",
            callback=not_empty,
            help="With --from-log: check the format against this recipe's synced tree.",
            autocompletion=complete_recipe,
        ),
    ] = None,
    show: Annotated[
        Optional[str],
        typer.Option(
            "--show",
            callback=not_empty,
            help="Show a stored profile run (run id prefix, or 'latest').",
        ),
    ] = None,
    compare: Annotated[
        Optional[tuple[str, str]],
        typer.Option(
            "--compare",
            help="RUN_A RUN_B: per-op deltas of B against A (run id prefixes or 'latest').",
        ),
    ] = None,
    npu: Annotated[
        bool,
        typer.Option(
            "--npu",
            help="With --show, --compare or --plot: ggml-hexagon's own profiler times instead of "
            "kz-profile's.",
        ),
    ] = False,
    plot: Annotated[
        Optional[Path],
        typer.Option("--plot", help="Write a PNG: a bar per op type, stacked by backend."),
    ] = None,
    max_spread: Annotated[
        float,
        typer.Option(
            "--max-spread",
            min=0.0,
            help="Repetitions whose timed walls are further apart than this (%) get no ranking.",
        ),
    ] = profiling.MAX_SPREAD_PCT,
    json_out: JsonOpt = False,
) -> None:
    """Where prefill and decode time goes: per op type its count, time, share of the graph time and
    the backend it ran on.

    Each repetition's op times and wall times come from one graph run: the report shows the
    repetition of median timed wall, with each op's spread over the repetitions; a phase whose
    repetitions disagree by more than --max-spread gets no ranking.

    Runs the release's kz-profile (built with the artifact from kernels/profile/) on the device:
    every graph node is timed through ggml-backend's eval callback, and wall time with and without
    that timer is shown side by side. On a Hexagon build (unless --dev none) ggml-hexagon's own
    profiler (GGML_HEXAGON_PROFILE=1) runs too; its format is checked against the pinned tree first.
    The run is stored with its provenance in results/profiles.jsonl; logs go to
    WORK/profile/RUN-ID/.

    --from-log FILE reads profile-op lines of a saved log instead; --show and --compare read stored
    runs.
    """
    settings = context(ctx).settings
    source = "npu" if npu else "graph"
    modes = [
        name
        for name, given in (("--from-log", from_log), ("--show", show), ("--compare", compare))
        if given is not None
    ]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} cannot be combined")
    if by not in ("op", "layer"):
        raise ConfigError(f"--by '{by}': give op or layer")
    store = profiling.ProfileStore(settings.results)
    if from_log is not None:
        phases = profiling.from_log(settings, from_log, recipe=recipe)
        if json_out:
            shown = [_phase_json(p, 1, by, max_spread) for p in phases]
            print_json({"log": str(from_log), "phases": shown})
            return
        for phase in phases:
            title = f"{from_log}: {phase.phase} (ggml-hexagon profiler)"
            _print_phase(phase, reps=1, by=by, title=title, max_spread=max_spread)
        return
    if compare is not None:
        a, b = store.select(compare[0]), store.select(compare[1])
        rows = profiling.compare(a, b, source=source, max_spread_pct=max_spread)
        if json_out:
            print_json(
                {
                    "a": a.run_id,
                    "b": b.run_id,
                    "source": source,
                    "rows": [
                        {
                            "phase": r.phase,
                            "op": r.op,
                            "a_usec": r.a_usec,
                            "b_usec": r.b_usec,
                            "a_backends": list(r.a_backends),
                            "b_backends": list(r.b_backends),
                            "delta_usec": r.delta_usec,
                            "change_pct": r.change_pct,
                        }
                        for r in rows
                    ],
                }
            )
            return
        _print_comparison(a, b, rows)
        return
    if show is not None:
        record = store.select(show)
    else:
        if model is None:
            raise ConfigError(
                "--model is required to profile on a device",
                hint="or --from-log FILE, --show RUN, --compare RUN_A RUN_B",
            )
        spec = ProfileSpec(
            model=model,
            n_prompt=prompt,
            n_gen=gen,
            n_ubatch=ubatch,
            threads=threads,
            ngl=ngl,
            dev=dev,
            reps=repetitions,
            env=tuple(parse_env_assignments(env or []).items()),
            timeout=timeout,
        )
        profiling.check_spec(
            spec
        )  # before connecting: a bad value is a usage error wherever the device is
        target, transport = open_device(settings, device, None, trust_new_host=False)
        try:
            with activity(f"kz-profile on {target.name}") as progress:

                def on_stderr(chunk: bytes) -> None:
                    lines = chunk.decode(errors="replace").strip().splitlines()
                    progress(lines[-1] if lines else "")

                run = profiling.profile(
                    settings, transport, target, spec, store, on_stderr=on_stderr
                )
        finally:
            transport.close()
        record = run.record
        if not json_out:
            say(f"stored profile run {record.run_id} in {store.path}; logs in {run.logs}")
    if plot is not None:
        written = profiling.plot(record, plot, source=source)
        if not json_out:
            say(f"wrote {written}")
    if json_out:
        reps = profiling.reps_of(record)
        summary = {
            key: [_phase_json(p, reps, by, max_spread) for p in getattr(record, key)]
            for key in ("graph", "npu")
        }
        print_json(record.to_dict() | {"summary": summary})
        return
    _print_record(record, by=by, source=source, max_spread=max_spread)


def _phase_json(phase: PhaseProfile, reps: int, by: str, max_spread: float) -> dict[str, object]:
    graph, plain, timed = profiling.phase_times(phase, reps)
    disagree = profiling.disagrees(phase, max_spread)
    return {
        "phase": phase.phase,
        "tokens": phase.tokens,
        # whose times these are; null: means over the repetitions
        "repetition": profiling.median_rep(phase),
        "graph_usec": graph,
        "wall_usec_plain": plain,
        "wall_usec_timed": timed,
        "wall_spread_pct": profiling.wall_spread_pct(phase),
        "repetitions_disagree": disagree,
        # no ranking of repetitions that disagree
        "ops": []
        if disagree
        else [
            {
                "layer": s.layer,
                "op": s.op,
                "backends": list(s.backends),
                "count": s.count,
                "usec": s.usec,
                "share": s.share,
                "spread_pct": s.spread_pct,
            }
            for s in profiling.summarize(phase, reps=reps, by=by)
        ],
    }


def _print_record(record: ProfileRecord, *, by: str, source: str, max_spread: float) -> None:
    reps = profiling.reps_of(record)
    say(
        f"profile {record.run_id}: {record.device.name}, build {record.build.build_id}, model "
        f"{record.model.path} "
        f"(sha256 {(record.model.sha256 or '?')[:12]}), {reps} repetition(s); times per repetition"
    )
    for phase in profiling.phases_of(record, source):
        title = f"{phase.phase}, {phase.tokens} tokens ({profiling.SOURCE_NAMES[source]})"
        _print_phase(phase, reps=reps, by=by, title=title, max_spread=max_spread)
    if source == "graph" and record.npu:
        say("ggml-hexagon's own profiler times are stored too: --show RUN --npu")


def _print_phase(phase: PhaseProfile, *, reps: int, by: str, title: str, max_spread: float) -> None:
    if profiling.disagrees(phase, max_spread):
        say(
            f"{phase.phase}: the {len(phase.wall_us_timed)} repetitions disagree "
            f"({profiling.describe_walls(phase)} > {max_spread:g}%): "
            "no ranking of its ops; profile again with more repetitions on a quieter device"
        )
        return
    rows = profiling.summarize(phase, reps=reps, by=by)
    headers = (["layer"] if by == "layer" else []) + [
        "op",
        "backend",
        "count",
        "time ms",
        "share",
        "spread",
    ]
    cells_of_rows: list[list[str]] = []
    for row in rows:
        cells = [] if row.layer is None else ["-" if row.layer == NO_LAYER else str(row.layer)]
        spread = "-" if row.spread_pct is None else f"{row.spread_pct:.0f}%"
        cells += [
            row.op,
            ", ".join(row.backends),
            str(row.count),
            f"{row.usec / 1000:.3f}",
            f"{row.share * 100:.1f}%",
            spread,
        ]
        cells_of_rows.append(cells)
    say_rich_table(
        [Column(header, right=header not in ("op", "backend")) for header in headers],
        cells_of_rows,
        title=title,
    )
    graph, plain, timed = profiling.phase_times(phase, reps)
    rep = profiling.median_rep(phase)
    which = (
        f"repetition {rep + 1} of {len(phase.wall_us_timed)}, the median timed wall"
        if rep is not None
        else "means over the repetitions"
    )
    line = f"{phase.phase} ({which}): graph time {graph / 1000:.3f} ms (sum of the ops)"
    if plain is not None and timed is not None:
        overhead = (timed - plain) / plain * 100 if plain else 0.0
        line += (
            f"; wall time {plain / 1000:.3f} ms without the per-node timer, {timed / 1000:.3f} ms "
            f"with it ({overhead:+.1f}%)"
        )
    elif plain is not None:
        line += f"; wall time {plain / 1000:.3f} ms"
    say(line)


def _print_comparison(a: ProfileRecord, b: ProfileRecord, rows: Sequence[ComparedOp]) -> None:
    headers = ("phase", "op", "A ms", "A backend", "B ms", "B backend", "delta ms", "change")
    say_rich_table(
        [Column(h, right=h in ("A ms", "B ms", "delta ms", "change")) for h in headers],
        [
            (
                row.phase,
                row.op,
                "-" if row.a_usec is None else f"{row.a_usec / 1000:.3f}",
                ", ".join(row.a_backends) or "-",
                "-" if row.b_usec is None else f"{row.b_usec / 1000:.3f}",
                ", ".join(row.b_backends) or "-",
                f"{row.delta_usec / 1000:+.3f}",
                "-" if row.change_pct is None else f"{row.change_pct:+.1f}%",
            )
            for row in rows
        ],
        title=f"{b.run_id} vs {a.run_id} (per repetition)",
    )
