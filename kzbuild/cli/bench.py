"""``kzbuild bench``: llama-bench on the device, one stored record per test with its provenance."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Annotated, Optional

import typer

from kzbuild.cli.benchoptions import (
    BatchOpt,
    CooldownOpt,
    DevOpt,
    GenOpt,
    ModelOpt,
    NglOpt,
    PlanOpt,
    PromptOpt,
    RepetitionsOpt,
    SeedOpt,
    SweepOpt,
    ThreadsOpt,
    UbatchOpt,
    bench_args,
)
from kzbuild.cli.connect import open_pool
from kzbuild.cli.memoryview import check_budget, plan_turn, print_turn, turn_json
from kzbuild.cli.options import (
    DeviceOpt,
    EnvOpt,
    JsonOpt,
    TimeoutOpt,
    WaitOpt,
)
from kzbuild.cli.results import print_records, record_json
from kzbuild.cli.run import PASSTHROUGH
from kzbuild.cli.ui import activity, context, print_json, say
from kzbuild.device.base import Transport
from kzbuild.device.devicelock import DeviceLock, device_lock
from kzbuild.measure import bench, plans, resultsdb
from kzbuild.measure.pool import spread
from kzbuild.measure.request import resolve_bench
from kzbuild.model.bench import BenchPoint, BenchRun, BenchSpec
from kzbuild.model.device import Device


def register(app: typer.Typer) -> None:
    app.command("bench", context_settings=PASSTHROUGH)(bench_command)


def bench_command(
    ctx: typer.Context,
    extra: Annotated[
        Optional[list[str]],
        typer.Argument(help="More llama-bench arguments after --, passed as given."),
    ] = None,
    model: ModelOpt = None,
    device: DeviceOpt = None,
    prompt: PromptOpt = None,
    gen: GenOpt = None,
    ngl: NglOpt = None,
    threads: ThreadsOpt = None,
    batch: BatchOpt = None,
    ubatch: UbatchOpt = None,
    dev: DevOpt = None,
    repetitions: RepetitionsOpt = None,
    env: EnvOpt = None,
    sweep: SweepOpt = None,
    seed: SeedOpt = None,
    cooldown: CooldownOpt = 0.0,
    timeout: TimeoutOpt = None,
    plan_file: PlanOpt = None,
    wait: WaitOpt = 0.0,
    json_out: JsonOpt = False,
) -> None:
    """Run llama-bench -o json on the device and store one record per test with its provenance.

    Only the given options reach llama-bench (plus -o json and -m). With --plan, each run of the
    plan in turn (its model's sha256 checked first). Results go to results/results.sqlite3 and the
    monthly shards results/YYYY-MM.jsonl; logs to WORK/bench/RUN-ID/.

    It holds the device root's lock (ROOT/.lock) from the model check to the last run, so no deploy
    switches or prunes the release under it; another kzbuild holding it exits 10 naming the holder
    (--wait waits). With --device POOL, the plan's runs are spread over the pool's free devices,
    each run whole on one device (under that device's lock); each run's records name its device.
    """
    settings = context(ctx).settings
    request = resolve_bench(bench_args(ctx))  # the llama-bench options above, as given
    loaded, specs = request.plan, request.runs
    runs: list[tuple[str, BenchRun]]  # each with the name of the device that ran it
    with ExitStack() as opened:
        members = open_pool(settings, request.device, None, False, opened)
        where = ", ".join(target.name for target, _ in members)
        with activity(f"llama-bench on {where}") as progress:

            def bench_on(
                member: tuple[Device, Transport], mine: Sequence[tuple[str, BenchSpec]]
            ) -> list[tuple[str, BenchRun]]:
                """One device's share of the runs, under its lock, each stored as it ends."""
                target, transport = member
                done = []
                with device_lock(transport, target.root, "bench", wait=wait) as lock:
                    if loaded is not None:
                        plans.check_model(loaded, transport, target)
                    with resultsdb.ResultsStore(settings.results) as store:
                        for name, spec in mine:
                            label = f"{target.name} {name}" if len(members) > 1 else name
                            run = bench.bench(
                                settings,
                                transport,
                                target,
                                spec,
                                store,
                                on_point=heartbeat(lock, point_progress(progress, label)),
                                on_stderr=last_line_to(progress),
                            )
                            done.append((target.name, run))
                return done

            runs = spread(members, specs, bench_on)
    by_name = {name: run.records for (name, _), (_, run) in zip(specs, runs, strict=True)}
    turned = plan_turn(loaded, by_name) if loaded is not None else None
    if json_out:
        shown = [
            {
                "run_id": run.run_id,
                "seed": run.seed,
                "logs": str(run.logs),
                "records": [record_json(r) for r in run.records],
            }
            for _, run in runs
        ]
        if loaded is None:
            print_json(shown[0])
        else:
            named = [
                {"name": n, "device": d} | s
                for (n, _), (d, _), s in zip(specs, runs, shown, strict=True)
            ]
            shown_turn = {"turn": turn_json(turned)} if turned else {}
            print_json({"plan": str(loaded.path), "runs": named} | shown_turn)
    else:
        for (name, _), (on, run) in zip(specs, runs, strict=True):
            title = f"run {run.run_id} on {on}" + (f" ({name})" if name else "")
            print_records(run.records, title=title, markdown=False)
            say(
                f"stored {len(run.records)} records as run {run.run_id} (sweep seed {run.seed}); "
                f"logs in {run.logs}"
            )
        if turned:
            print_turn("", turned)
    check_budget([r for _, run in runs for r in run.records])


def heartbeat(
    lock: DeviceLock, on_point: Callable[[BenchPoint], None]
) -> Callable[[BenchPoint], None]:
    """``on_point`` after renewing the device lock's heartbeat: a sweep of many points may outlast
    its lease."""

    def on_each(point: BenchPoint) -> None:
        lock.refresh()
        on_point(point)

    return on_each


def point_progress(progress: Callable[[str], None], label: str) -> Callable[[BenchPoint], None]:
    """Shows each sweep point of a run (named by ``label``) as progress."""
    prefix = f"{label}: " if label else ""

    def on_point(point: BenchPoint) -> None:
        shown = " ".join(f"{k}={v}" for k, v in point.values)
        progress(f"{prefix}run {point.index + 1}/{point.total} {shown}")

    return on_point


def last_line_to(progress: Callable[[str], None]) -> Callable[[bytes], None]:
    """An output sink that shows the latest line of a chunk as progress."""

    def on_output(chunk: bytes) -> None:
        # str.strip also drops what bytes.strip keeps (\x1c, NBSP): a chunk of those has no lines
        lines = chunk.decode(errors="replace").strip().splitlines()
        progress(lines[-1] if lines else "")

    return on_output
