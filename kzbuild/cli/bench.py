"""``kzbuild bench``: llama-bench on the device, one stored record per test with its provenance."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kzbuild import bench, results
from kzbuild.cli.connect import open_device
from kzbuild.cli.options import DeviceOpt, EnvOpt, JsonOpt, TimeoutOpt
from kzbuild.cli.results import print_records, record_json, say
from kzbuild.cli.run import PASSTHROUGH
from kzbuild.cli.ui import activity, context, not_empty, print_json
from kzbuild.model.bench import OPTIONS_BY_NAME, BenchPoint, BenchSpec
from kzbuild.run import parse_env_assignments


def register(app: typer.Typer) -> None:
    app.command("bench", context_settings=PASSTHROUGH)(bench_command)


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
    target, transport = open_device(settings, device, None, trust_new_host=False)
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
        print_json({"run_id": run.run_id, "seed": run.seed, "logs": str(run.logs), "records": [record_json(r) for r in run.records]})
        return
    print_records(run.records, title=f"run {run.run_id} on {target.name}", markdown=False)
    say(f"stored {len(run.records)} records as run {run.run_id} (sweep seed {run.seed}); logs in {run.logs}")


