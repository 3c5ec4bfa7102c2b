"""``kzbuild run``: run a tool of the device's current release with the device env, and store its
memory as a record."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kzbuild.cli.connect import open_device
from kzbuild.cli.memoryview import check_budget, memory_cells
from kzbuild.cli.options import DeviceOpt, EnvOpt, TimeoutOpt, WaitOpt
from kzbuild.cli.ui import context, not_empty, pass_through, say
from kzbuild.device.devicelock import device_lock
from kzbuild.device.run import check_seconds, current_release, parse_env_assignments
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.toolrun import run_tool
from kzbuild.model.memory import MemoryLimits, size_option

# everything after TOOL (options too) belongs to the tool
PASSTHROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False}


def register(app: typer.Typer) -> None:
    app.command("run", context_settings=PASSTHROUGH)(run_command)


def run_command(
    ctx: typer.Context,
    tool: Annotated[
        str,
        typer.Argument(
            callback=not_empty, help="A program of the current release's bin/, e.g. llama-cli."
        ),
    ],
    args: Annotated[
        Optional[list[str]], typer.Argument(help="Its arguments, passed exactly as given.")
    ] = None,
    device: DeviceOpt = None,
    env: EnvOpt = None,
    timeout: TimeoutOpt = None,
    memory_budget: Annotated[
        Optional[str],
        typer.Option(
            "--memory-budget",
            callback=not_empty,
            help="The tool's peak resident memory may not exceed this (e.g. 4GiB): exit 15.",
        ),
    ] = None,
    htp_session_limit: Annotated[
        Optional[str],
        typer.Option(
            "--htp-session-limit",
            callback=not_empty,
            help="The buffers of one HTP session may not exceed this (e.g. 3.5GiB): exit 15.",
        ),
    ] = None,
    wait: WaitOpt = 0.0,
) -> int:
    """Run TOOL from the device's current release with the device env; exits with the tool's code.

    Adds nothing: no threads, batch or env of its own. Everything after TOOL, options too, goes to
    the tool unchanged: kzbuild run llama-cli -m models/x.gguf -p hi

    The tool runs under the release's kz-peakrss. A run that succeeds is stored as a record of
    kind run (kzbuild results show RUN-ID): its peak memory, the buffers llama.cpp logged (its
    tools log them with -v), the build, the device and its provenance; its stderr stays in
    WORK/run/RUN-ID/. Over --memory-budget or --htp-session-limit it exits 15.

    It holds the device root's lock (ROOT/.lock) while the tool runs, so no deploy switches or
    prunes the release under it; another kzbuild holding it exits 10 naming the holder (--wait
    waits).
    """
    settings = context(ctx).settings
    check_seconds("--timeout", timeout)
    extra_env = parse_env_assignments(env or [])
    limits = MemoryLimits(
        budget_bytes=size_option("--memory-budget", memory_budget),
        htp_session_bytes=size_option("--htp-session-limit", htp_session_limit),
    )
    target, transport = open_device(settings, device, None, trust_new_host=False)
    try:
        with (
            device_lock(transport, target.root, "run", wait=wait),
            ResultsStore(settings.results) as store,
        ):
            code, record = run_tool(
                settings,
                transport,
                target,
                current_release(transport, target),
                tool,
                args or [],
                store,
                env=extra_env,
                limits=limits,
                timeout=timeout,
                on_stdout=pass_through(err=False),
                on_stderr=pass_through(err=True),
            )
    finally:
        transport.close()
    if record is not None:
        peak, buffers, over = memory_cells(record.memory)
        say(
            f"stored run {record.run_id}: peak {peak} MiB, buffers {buffers} MiB"
            + (f", {over}" if over else "")
            + f"; kzbuild results show {record.run_id}",
            err=True,
        )
        check_budget([record])
    return code
