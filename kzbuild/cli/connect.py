"""Opening the device a command names, and showing an upload's progress."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kzbuild.adapters.settings import Settings
from kzbuild.cli.ui import ProgressLines, rich_console, stderr_is_terminal
from kzbuild.device.base import Transport
from kzbuild.device.registry import connect, resolve_device
from kzbuild.device.store import TransferProgress
from kzbuild.model.device import Device


def open_device(
    settings: Settings, spec: str | None, default: str | None, trust_new_host: bool
) -> tuple[Device, Transport]:
    device = resolve_device(settings, spec, default)
    options = {"trust_new_host": trust_new_host} if device.transport == "ssh" else {}
    return device, connect(device, **options)


@contextmanager
def transfer_bars(enabled: bool) -> Iterator[Callable[[TransferProgress], None] | None]:
    """A progress bar with bytes and rate for an upload (in logs and pipes, ProgressLines); nothing
    when ``enabled`` is false."""
    if not enabled:
        yield None
        return
    if not stderr_is_terminal():  # bars show nothing in logs and pipes
        with ProgressLines("upload") as lines:
            yield lambda event: lines.update(
                "sending",
                f"{event.done * 100 // max(event.total, 1)}% ({event.done}/{event.total} bytes) "
                f"{event.label}",
            )
        return
    # imported here: rich.progress costs every kzbuild start-up ~60 ms otherwise
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=rich_console(stderr=True), transient=True) as bars:
        task: TaskID | None = None

        def update(event: TransferProgress) -> None:
            nonlocal task
            if task is None:
                task = bars.add_task(event.label, total=event.total)
            bars.update(task, completed=event.done, description=event.label[-40:])

        yield update
