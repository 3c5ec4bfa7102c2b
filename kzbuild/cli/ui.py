"""Terminal helpers shared by the command modules: consoles, logging, JSON, progress."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from kzbuild.settings import Settings

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


@dataclass
class Context:
    verbose: int
    settings_factory: Callable[[], Settings]
    _settings: Settings | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = self.settings_factory()
        return self._settings


def context(ctx: typer.Context) -> Context:
    obj = ctx.find_root().obj
    assert isinstance(obj, Context)
    return obj


def not_empty(value: str | None) -> str | None:
    """typer callback: an option or argument given as '' is a usage error, never taken for its default."""
    if value is not None and not value.strip():
        raise typer.BadParameter("must not be empty")
    return value


def setup_logging(verbose: int) -> None:
    """Warnings always; -v adds every external command (kzbuild.proc) and progress notes; -vv debug."""
    root = logging.getLogger("kzbuild")
    root.handlers[:] = [RichHandler(console=err_console, show_time=False, show_path=False, markup=False)]
    root.propagate = False
    root.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG))
    logging.getLogger("kzbuild.proc").setLevel(logging.DEBUG if verbose else logging.WARNING)


def tracebacks_wanted() -> bool:
    return logging.getLogger("kzbuild").isEnabledFor(logging.DEBUG)


def print_json(data: object) -> None:
    console.print_json(json.dumps(data, default=str))


@contextmanager
def activity(message: str) -> Iterator[Callable[[str], None]]:
    """A spinner whose text follows the latest progress line of a long operation."""
    with err_console.status(message) as status:

        def update(line: str) -> None:
            line = line.strip()
            if line:
                status.update(f"{message}  [dim]{escape(line[-100:])}[/dim]")  # tool output is text, not markup

        yield update
