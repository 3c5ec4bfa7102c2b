"""``kzbuild models``: model files for tests and benchmarks (``models tiny``; more to come)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from kzbuild import tinymodel
from kzbuild.cli.ui import console

models_app = typer.Typer(
    name="models",
    help="Model files: generate tiny test models.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

TinyArch = Enum("TinyArch", {name: name for name in tinymodel.ARCHS}, type=str)
TinyType = Enum("TinyType", {name: name for name in tinymodel.FTYPES}, type=str)


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
    models_app.command("tiny")(tiny_command)


def tiny_command(
    output: Annotated[Path, typer.Option("-o", "--output", help="GGUF file to write.")],
    arch: Annotated[TinyArch, typer.Option("--arch", help="qwen35 (gated delta net + full attention) or llama.")] = TinyArch.qwen35,
    ftype: Annotated[TinyType, typer.Option("--type", help="Weight type of the matrices (norms stay f32).")] = TinyType.q4_0,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Random seed; the same arguments give the same bytes.")] = 0,
) -> None:
    """Write a tiny random GGUF model (a few hundred KB) that llama.cpp loads and runs."""
    path = tinymodel.write_tiny_model(output, arch=arch.value, ftype=ftype.value, seed=seed)
    console.print(f"wrote {path} ({arch.value}, {ftype.value}, seed {seed}, {path.stat().st_size} bytes)", soft_wrap=True)
