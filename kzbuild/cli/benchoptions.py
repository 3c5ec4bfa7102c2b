"""llama-bench's options, shared by `kzbuild bench` and `kzbuild ab` (apart from options.py: the
help texts come from the bench model, which other commands need not load)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kzbuild.cli.ui import not_empty
from kzbuild.model.bench import OPTIONS_BY_NAME
from kzbuild.model.request import BenchArgs

ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        callback=not_empty,
        help="Model path on the device; relative paths start at the device root (models/...). "
        "Required without --plan.",
    ),
]
PromptOpt = Annotated[
    Optional[str],
    typer.Option("-p", "--prompt", callback=not_empty, help=OPTIONS_BY_NAME["p"].help),
]
GenOpt = Annotated[
    Optional[str], typer.Option("-n", "--gen", callback=not_empty, help=OPTIONS_BY_NAME["n"].help)
]
NglOpt = Annotated[
    Optional[str], typer.Option("--ngl", callback=not_empty, help=OPTIONS_BY_NAME["ngl"].help)
]
ThreadsOpt = Annotated[
    Optional[str],
    typer.Option("-t", "--threads", callback=not_empty, help=OPTIONS_BY_NAME["t"].help),
]
BatchOpt = Annotated[
    Optional[str], typer.Option("-b", "--batch", callback=not_empty, help=OPTIONS_BY_NAME["b"].help)
]
UbatchOpt = Annotated[
    Optional[str],
    typer.Option("--ub", "--ubatch", callback=not_empty, help=OPTIONS_BY_NAME["ub"].help),
]
DevOpt = Annotated[
    Optional[str], typer.Option("--dev", callback=not_empty, help=OPTIONS_BY_NAME["dev"].help)
]
RepetitionsOpt = Annotated[
    Optional[str],
    typer.Option("-r", "--repetitions", callback=not_empty, help=OPTIONS_BY_NAME["r"].help),
]
SweepOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--sweep",
        help="AXIS=V1,V2,... (p n ngl t b ub dev r, or env:NAME); several give their cartesian "
        "product.",
    ),
]
SeedOpt = Annotated[
    Optional[int],
    typer.Option(
        "--seed", min=0, help="Seed of the randomized sweep order (default: fresh, recorded)."
    ),
]
CooldownOpt = Annotated[
    float, typer.Option("--cooldown", help="Seconds to wait between runs of a sweep.")
]
PlanOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--plan",
        help="An experiment plan (plans/NAME.yaml): model, device, runs; instead of the options "
        "above.",
    ),
]


def bench_args(ctx: typer.Context) -> BenchArgs:
    """What a measuring command's line gave of the options above (and --device, -- EXTRA): the
    command declares them under BenchArgs' names, the resolver makes the request of them."""
    names = BenchArgs.names()
    given: dict[str, Any] = {
        name: tuple(value) if isinstance(value, list) else value
        for name, value in ctx.params.items()
        if name in names and value is not None
    }
    if "plan_file" in given:  # click keeps a path option as the string given
        given["plan_file"] = Path(given["plan_file"])
    return BenchArgs(**given)
