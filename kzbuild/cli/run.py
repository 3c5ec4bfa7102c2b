"""``kzbuild run``: run a tool of the device's current release with the device env."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kzbuild.cli.connect import open_device
from kzbuild.cli.options import DeviceOpt, EnvOpt, TimeoutOpt, WaitOpt
from kzbuild.cli.ui import context, not_empty, pass_through
from kzbuild.device.devicelock import device_lock
from kzbuild.device.run import check_seconds, current_release, parse_env_assignments, run_in_release

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
    wait: WaitOpt = 0.0,
) -> int:
    """Run TOOL from the device's current release with the device env; exits with the tool's code.

    Adds nothing: no threads, batch or env of its own. Everything after TOOL, options too, goes to
    the tool unchanged: kzbuild run llama-cli -m models/x.gguf -p hi

    It holds the device root's lock (ROOT/.lock) while the tool runs, so no deploy switches or
    prunes the release under it; another kzbuild holding it exits 10 naming the holder (--wait
    waits).
    """
    settings = context(ctx).settings
    check_seconds("--timeout", timeout)
    extra_env = parse_env_assignments(env or [])
    target, transport = open_device(settings, device, None, trust_new_host=False)
    try:
        with device_lock(transport, target.root, "run", wait=wait):
            release = current_release(transport, target)
            return run_in_release(
                settings,
                transport,
                target,
                release,
                tool,
                args or [],
                env=extra_env,
                timeout=timeout,
                on_stdout=pass_through(err=False),
                on_stderr=pass_through(err=True),
            )[1]
    finally:
        transport.close()
