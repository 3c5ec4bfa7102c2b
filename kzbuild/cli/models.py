"""``kzbuild models``: model files for tests and benchmarks (``models tiny``), and storing
models on devices (``models push``)."""

from __future__ import annotations

from contextlib import closing
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from kzbuild.cli.connect import open_device
from kzbuild.cli.options import DeviceOpt, JsonOpt, TrustOpt, WaitOpt
from kzbuild.cli.ui import (
    command_group,
    context,
    file_size,
    not_empty,
    print_json,
    say,
    styled,
    transfer_progress,
)
from kzbuild.device import modelpush
from kzbuild.errors import ConfigError
from kzbuild.model import tinyspec

models_app = command_group(
    "models", "Model files: generate tiny test models, store models on devices."
)

# built from the generator's own lists, so a new arch or type shows up in --help by itself
TinyArch = Enum("TinyArch", {name: name for name in tinyspec.ARCHS}, type=str)  # type: ignore[misc]
TinyType = Enum("TinyType", {name: name for name in tinyspec.FTYPES}, type=str)  # type: ignore[misc]


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
    models_app.command("tiny")(tiny_command)
    models_app.command("push")(push_command)


def tiny_command(
    output: Annotated[Path, typer.Option("-o", "--output", help="GGUF file to write.")],
    arch: Annotated[
        TinyArch, typer.Option("--arch", help="qwen35 (gated delta net + full attention) or llama.")
    ] = TinyArch("qwen35"),
    ftype: Annotated[
        TinyType, typer.Option("--type", help="Weight type of the matrices (norms stay f32).")
    ] = TinyType("q4_0"),
    seed: Annotated[
        int,
        typer.Option("--seed", min=0, help="Random seed; the same arguments give the same bytes."),
    ] = 0,
) -> None:
    """Write a tiny random GGUF model (a few hundred KB) that llama.cpp loads and runs."""
    from kzbuild.measure.tinymodel import write_tiny_model  # numpy and gguf load only when needed

    if output.is_dir():
        raise ConfigError(f"--output {output} is a folder; name the .gguf file to write")
    path = write_tiny_model(output, arch=arch.value, ftype=ftype.value, seed=seed)
    say(f"wrote {path} ({arch.value}, {ftype.value}, seed {seed}, {path.stat().st_size} bytes)")


def push_command(
    ctx: typer.Context,
    model: Annotated[Path, typer.Argument(help="The GGUF file to store on the device.")],
    device: DeviceOpt = None,
    name: Annotated[
        Optional[str],
        typer.Option(
            "--name",
            callback=not_empty,
            help="Readable name on the device (ROOT/models/NAME). Default: the file name.",
        ),
    ] = None,
    split: Annotated[
        Optional[bool],
        typer.Option(
            "--split/--whole",
            help="Store it as GGUF splits, each kept once on the device, so quant variants share "
            "the files of the tensors they share; or as one file. Default: splits when the device "
            "holds split models and one shares a tensor with it, else one file.",
            show_default=False,
        ),
    ] = None,
    wait: WaitOpt = 0.0,
    trust_new_host: TrustOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Store a model on a device as ROOT/models/<sha256>.gguf plus a readable name; resumes,
    verifies, never resends.

    The file travels whole, checked on the device (sha256 of every piece) while it arrives; a
    model that shares tensors with one on the device travels in pieces cut at its tensors, the
    shared ones copied there instead of sent. The model's sha256 and pieces are kept in the
    cache dir by its file's stat data."""
    settings = context(ctx).settings
    target, transport = open_device(settings, device, None, trust_new_host)
    with closing(transport):
        with transfer_progress(not json_out) as on_progress:
            result = modelpush.push_model(
                transport,
                target,
                model,
                name=name,
                on_progress=on_progress,
                wait=wait,
                cache=settings.model_digests,
                split=split,
            )
    if json_out:
        print_json(result.to_dict())
        return
    if result.already_there:
        say(
            styled("green", f"{model.name} is already on {result.device}"),
            f" as {result.path}; sent 0 bytes",
        )
    else:
        resumed = (
            f", resumed after {file_size(result.bytes_resumed)}" if result.bytes_resumed else ""
        )
        reused = (
            f", {file_size(result.bytes_reused)} copied from models on the device"
            if result.bytes_reused
            else ""
        )
        say(
            styled("green", "pushed"),
            f" {model.name} to {result.device} as {result.path} "
            f"({file_size(result.bytes_sent)} sent{reused}{resumed}, verified, "
            f"{result.seconds:.2f} s)",
        )
    say(f"  {result.link} -> {result.sha256}.gguf")
