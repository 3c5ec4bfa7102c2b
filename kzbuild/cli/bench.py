"""``kzbuild bench``: llama-bench on the device, one stored record per test with its provenance."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from kzbuild.cli.connect import open_device
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
from kzbuild.device.devicelock import DeviceLock, device_lock
from kzbuild.measure import bench, plans, resultsdb
from kzbuild.measure.request import resolve_bench
from kzbuild.model.bench import BenchPoint, BenchRun


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
    (--wait waits).
    """
    settings = context(ctx).settings
    request = resolve_bench(bench_args(ctx))  # the llama-bench options above, as given
    loaded, specs = request.plan, request.runs
    target, transport = open_device(settings, request.device, None, trust_new_host=False)
    runs: list[BenchRun] = []
    try:
        with device_lock(transport, target.root, "bench", wait=wait) as lock:
            if loaded is not None:
                plans.check_model(loaded, transport, target)
            with resultsdb.ResultsStore(settings.results) as store:
                for name, spec in specs:
                    with bench_progress(
                        f"llama-bench on {target.name}" + (f": {name}" if name else "")
                    ) as (on_point, on_stderr):
                        runs.append(
                            bench.bench(
                                settings,
                                transport,
                                target,
                                spec,
                                store,
                                on_point=heartbeat(lock, on_point),
                                on_stderr=on_stderr,
                            )
                        )
    finally:
        transport.close()
    by_name = {name: run.records for (name, _), run in zip(specs, runs, strict=True)}
    turned = plan_turn(loaded, by_name) if loaded is not None else None
    if json_out:
        shown = [
            {
                "run_id": run.run_id,
                "seed": run.seed,
                "logs": str(run.logs),
                "records": [record_json(r) for r in run.records],
            }
            for run in runs
        ]
        if loaded is None:
            print_json(shown[0])
        else:
            named = [{"name": n} | s for (n, _), s in zip(specs, shown, strict=True)]
            shown_turn = {"turn": turn_json(turned)} if turned else {}
            print_json({"plan": str(loaded.path), "runs": named} | shown_turn)
    else:
        for (name, _), run in zip(specs, runs, strict=True):
            title = f"run {run.run_id} on {target.name}" + (f" ({name})" if name else "")
            print_records(run.records, title=title, markdown=False)
            say(
                f"stored {len(run.records)} records as run {run.run_id} (sweep seed {run.seed}); "
                f"logs in {run.logs}"
            )
        if turned:
            print_turn("", turned)
    check_budget([r for run in runs for r in run.records])


def heartbeat(
    lock: DeviceLock, on_point: Callable[[BenchPoint], None]
) -> Callable[[BenchPoint], None]:
    """``on_point`` after renewing the device lock's heartbeat: a sweep of many points may outlast
    its lease."""

    def on_each(point: BenchPoint) -> None:
        lock.refresh()
        on_point(point)

    return on_each


@contextmanager
def bench_progress(
    message: str,
) -> Iterator[tuple[Callable[[BenchPoint], None], Callable[[bytes], None]]]:
    """A spinner following the sweep point and llama-bench's latest log line."""
    with activity(message) as progress:

        def on_point(point: BenchPoint) -> None:
            shown = " ".join(f"{k}={v}" for k, v in point.values)
            progress(f"run {point.index + 1}/{point.total} {shown}")

        yield on_point, last_line_to(progress)


def last_line_to(progress: Callable[[str], None]) -> Callable[[bytes], None]:
    """An output sink that shows the latest line of a chunk as progress."""

    def on_output(chunk: bytes) -> None:
        # str.strip also drops what bytes.strip keeps (\x1c, NBSP): a chunk of those has no lines
        lines = chunk.decode(errors="replace").strip().splitlines()
        progress(lines[-1] if lines else "")

    return on_output
