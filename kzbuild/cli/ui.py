"""The one place kzbuild speaks to the user: plain lines, styles, tables, JSON, progress, logging
and the error lines; the commands print through it alone (tests/test_output.py).

One rule styles everything, colours(): styles on a terminal or with FORCE_COLOR, never with
NO_COLOR or TERM=dumb, never in a pipe. ``say()`` writes plain lines with optional styles and never
imports rich: the commands that run most (status, sync, build) print only such lines, so their
start-up does not pay rich's ~25 ms of imports, and data in them (paths, names) is never taken for
markup. Tables (say_rich_table), JSON, spinners and bars go through rich consoles made on first use
under the same rule.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, cast

import typer

from kzbuild.adapters import proc, yamlconf
from kzbuild.adapters.settings import Settings
from kzbuild.errors import KzError

if TYPE_CHECKING:
    from rich.console import Console

    from kzbuild.device.store import TransferProgress
    from kzbuild.model.build import BuildEvent


# Width of a console that writes to a log or a pipe: no terminal to fit, so no line is wrapped or
# cut (a sha256, a path, a table cell stays whole on its line). Tables keep their natural width.
UNWRAPPED_WIDTH = 100_000


def rich_console(*, stderr: bool) -> Console:
    """The rich Console behind ``console`` (stdout) or ``err_console``; rich's own objects
    (Progress, RichHandler) get this real one. Styles follow the same rule as say()'s lines
    (colours()), not rich's own reading of the env. On a terminal it fits the terminal; elsewhere
    nothing wraps (rich would otherwise wrap at 80 columns, or at the width of another stream that
    is a terminal)."""
    stream = sys.stderr if stderr else sys.stdout
    return _rich_console(stderr, colours(stream), stream.isatty())


@cache
def _rich_console(stderr: bool, styles: bool, terminal: bool) -> Console:
    from rich.console import Console

    # "standard" colours: the styles used here are the 8 basic ones, the same codes as say()'s;
    # a terminal without styles (NO_COLOR) still animates its bars and spinners
    system: Literal["standard"] | None = "standard" if styles else None
    if terminal:
        return Console(stderr=stderr, highlight=False, force_terminal=True, color_system=system)
    return Console(
        stderr=stderr,
        highlight=False,
        force_terminal=styles,
        color_system=system,
        width=UNWRAPPED_WIDTH,
        soft_wrap=True,
    )


class _ConsoleOnFirstUse:
    """Stands for rich_console(): rich's imports cost every start ~25 ms, and many commands print no
    rich output."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr

    def __getattr__(self, name: str) -> Any:
        return getattr(rich_console(stderr=self._stderr), name)


console = cast("Console", _ConsoleOnFirstUse(stderr=False))
err_console = cast("Console", _ConsoleOnFirstUse(stderr=True))

SGR = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "cyan": "36",
    "magenta": "35",
    "white": "37",
    "bold red": "1;31",
}


@dataclass(frozen=True)
class Styled:
    """Text that say() shows in ``style`` (a key of SGR) on a terminal, and plain elsewhere."""

    style: str
    text: str


def styled(style: str, text: object) -> Styled:
    if style not in SGR:
        raise ValueError(f"unknown style {style!r}")
    return Styled(style, str(text))


def colours(stream: IO[str]) -> bool:
    """Whether to style output on ``stream``: a terminal, as rich decides (NO_COLOR, FORCE_COLOR,
    TERM=dumb)."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return stream.isatty() and os.environ.get("TERM") != "dumb"


# on a terminal, control characters in data (a file name, a device's answer) show as '?', so they
# cannot move the cursor or restyle it
TERMINAL_SAFE = {code: "?" for code in [*range(0x20), 0x7F] if chr(code) not in "\t\n"}


def say(*parts: str | Styled, err: bool = False) -> None:
    """Print one line made of ``parts``: strings are printed as they are, never read as markup."""
    stream = sys.stderr if err else sys.stdout
    colour = colours(stream)

    def shown(text: str) -> str:
        return text.translate(TERMINAL_SAFE) if colour else text

    text = "".join(
        shown(part)
        if isinstance(part, str)
        else f"\x1b[{SGR[part.style]}m{shown(part.text)}\x1b[0m"
        if colour
        else part.text
        for part in parts
    )
    stream.write(text + "\n")
    stream.flush()


def write_out(text: str) -> None:
    """Text for another program or a file (an mbox, a markdown report) on stdout, as it is."""
    sys.stdout.write(text)
    sys.stdout.flush()


def pass_through(*, err: bool) -> Callable[[bytes], None]:
    """A writer of a program's output, byte for byte, to stdout (or stderr), as it comes."""
    stream = sys.stderr if err else sys.stdout

    def write(chunk: bytes) -> None:
        stream.buffer.write(chunk)
        stream.buffer.flush()

    return write


def stdout_is_terminal() -> bool:
    """Whether a rich table fits the terminal; a pipe or a file gets plain lines instead."""
    return sys.stdout.isatty()


def say_table(rows: list[tuple[str | Styled, ...]]) -> None:
    """Rows of a key column and the rest of the line, keys padded to one width; lines are never
    wrapped or cut, so a pipe gets every name whole."""
    width = max((len(_text(row[0])) for row in rows), default=0)
    for key, *rest in rows:
        say(key, " " * (width - len(_text(key)) + 2), *rest)


def say_grid(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *, alert: str = ""
) -> None:
    """A table as plain lines, columns padded to their widest cell: for pipes and files, where a
    rich table costs its layout and cuts or wraps cells. Rows holding ``alert`` show in red."""
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) for cell, width in zip(cells, widths, strict=True)
        ).rstrip()

    say(title)
    say(line(headers))
    for row in rows:
        say(styled("red", line(row)) if alert and alert in row else line(row))


def _text(part: str | Styled) -> str:
    return part if isinstance(part, str) else part.text


# a table cell: text, styled text, or parts of one ("\n" in a part starts a line in the cell)
Cell = str | Styled | tuple[str | Styled, ...]


@dataclass(frozen=True)
class Column:
    """A column of a rich table: numbers ``right``; ``fold`` wraps a long cell rather than cut it
    on a narrow terminal; ``whole`` keeps it on one line (an id, to be copied)."""

    header: str
    right: bool = False
    fold: bool = False
    whole: bool = False


def say_rich_table(
    columns: Sequence[str | Column],
    rows: Iterable[Sequence[Cell]],
    *,
    title: str | None = None,
    bare: bool = False,
    row_styles: Sequence[str | None] = (),
) -> None:
    """A rich table on stdout: framed with its ``title``, or ``bare`` (no frame, two spaces
    between columns). Cells are text, never markup; a row's style in ``row_styles`` (a key of
    SGR) colours it whole."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    table = (
        Table(box=None, show_header=True, padding=(0, 2))
        if bare
        else Table(title=None if title is None else escape(title))
    )
    for column in columns:
        column = Column(column) if isinstance(column, str) else column
        table.add_column(
            column.header,
            justify="right" if column.right else "left",
            overflow="fold" if column.fold else "ellipsis",
            no_wrap=column.whole,
        )

    def text(cell: Cell) -> Text:
        parts = cell if isinstance(cell, tuple) else (cell,)
        return Text.assemble(
            *(part if isinstance(part, str) else (part.text, part.style) for part in parts)
        )

    for number, row in enumerate(rows):
        style = row_styles[number] if number < len(row_styles) else None
        table.add_row(*(text(cell) for cell in row), style=style)
    console.print(table)


def file_size(size: int) -> str:
    """Bytes as people read them: "1.2 MB" (powers of 1000)."""
    from rich.filesize import decimal

    return decimal(size)


def stderr_is_terminal() -> bool:
    """Whether progress may draw bars and spinners: only on a real terminal (FORCE_COLOR styles
    text, it makes no log a terminal)."""
    return sys.stderr.isatty()


@dataclass
class Context:
    verbose: int
    settings_factory: Callable[[], Settings]
    _settings: Settings | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = self.settings_factory()
            yamlconf.remember_parsed_in(self._settings.parsed_yaml)
        return self._settings


def context(ctx: typer.Context) -> Context:
    obj = ctx.find_root().obj
    assert isinstance(obj, Context)
    return obj


def resolve_settings(root_params: Mapping[str, Any]) -> Settings:
    """Settings from the root options (--project, --cache-dir, --work-dir, --results-dir) and the
    env: one place for the commands and for shell completion, which runs before the root
    callback."""

    def path(name: str) -> Path | None:
        value = root_params.get(name)  # click keeps a path option as the string given
        return None if value is None else Path(value)

    return Settings.resolve(
        os.environ,
        cwd=Path.cwd(),
        project=path("project"),
        cache=path("cache_dir"),
        work=path("work_dir"),
        results=path("results_dir"),
    )


def not_empty(value: str | None) -> str | None:
    """typer callback: an option or argument given as '' is a usage error, never taken for its
    default."""
    if value is not None and not value.strip():
        raise typer.BadParameter("must not be empty")
    return value


class _RichHandlerOnFirstRecord(logging.Handler):
    """rich's log handler on a terminal, made for the first record that passes the level (rich
    costs ~25 ms of imports); in a log or a pipe, plain "LEVEL message" lines: rich's handler
    would pad every record to the console's width, which there has no bound."""

    def __init__(self) -> None:
        super().__init__()
        self._handler: logging.Handler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self._handler is None and not sys.stderr.isatty():
            self._handler = logging.StreamHandler(sys.stderr)
            self._handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        if self._handler is None:
            from rich.logging import RichHandler

            self._handler = RichHandler(
                console=rich_console(stderr=True), show_time=False, show_path=False, markup=False
            )
        self._handler.handle(record)


def setup_logging(verbose: int) -> None:
    """Warnings always; -v adds every external command (INFO, from kzbuild.adapters.proc and the ssh
    transport) and progress notes; -vv debug."""
    root = logging.getLogger("kzbuild")
    handler = _RichHandlerOnFirstRecord()
    handler.addFilter(proc.RedactCredentials())  # warnings name remote caches by URL
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG))


def tracebacks_wanted() -> bool:
    return logging.getLogger("kzbuild").isEnabledFor(logging.DEBUG)


def print_json(data: object) -> None:
    console.print_json(json.dumps(data, default=str))


PROGRESS_INTERVAL_ENV = "KZ_PROGRESS_INTERVAL"
DEFAULT_PROGRESS_INTERVAL = 30.0
GIT_PHASE = re.compile(
    r"^(?:remote: )?(?P<stage>[A-Za-z][A-Za-z ]*?):\s+(?P<fraction>\d+%.*)$"
)  # "Receiving objects:  57% (81/141)"


def progress_interval() -> float:
    """Seconds between progress lines in logs and pipes: KZ_PROGRESS_INTERVAL, else 30."""
    try:
        seconds = float(os.environ.get(PROGRESS_INTERVAL_ENV, ""))
    except ValueError:
        return DEFAULT_PROGRESS_INTERVAL
    return seconds if 0 < seconds < math.inf else DEFAULT_PROGRESS_INTERVAL


class ProgressLines:
    """Progress for logs and pipes, where bars and spinners show nothing: a UTC-stamped line with
    the stage and its fraction when it starts, when the stage changes, and at least every
    interval."""

    def __init__(self, title: str, interval: float | None = None) -> None:
        self.title = title
        self.interval = interval or progress_interval()
        self._stage = "started"
        self._fraction = ""
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="kz-progress-lines")

    def __enter__(self) -> ProgressLines:
        self._print()
        self._heartbeat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._heartbeat.join()

    def update(self, stage: str | None, fraction: str = "") -> None:
        """Record the latest state (``stage`` None: the same stage); a new stage is printed at
        once."""
        with self._lock:
            changed = stage is not None and stage != self._stage
            self._stage, self._fraction = stage or self._stage, fraction
        if changed:
            self._print()

    def _beat(self) -> None:
        while not self._done.wait(self.interval):
            self._print()

    def _print(self) -> None:
        with self._lock:
            stage, fraction = self._stage, self._fraction
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        elapsed = time.monotonic() - self._started
        say(f"{stamp} {self.title}: {stage} {fraction}".rstrip() + f" ({elapsed:.0f} s)", err=True)


class ProgressDisplay:
    """One long operation's progress, of one of three kinds: an ``activity`` (a spinner following
    the latest line a tool printed), ``steps`` (ninja's [n/N]) or ``bytes`` (an upload). On a
    terminal, rich's live display (imported here, ~60 ms, only when a terminal shows it); in logs
    and pipes, where bars and spinners show nothing, ProgressLines."""

    def __init__(self, title: str, kind: Literal["activity", "steps", "bytes"]) -> None:
        self.title = title
        self.kind = kind
        self._lines = None if stderr_is_terminal() else ProgressLines(title)
        self._live: Any = None  # rich.progress.Progress, on a terminal
        self._task: Any = None

    def __enter__(self) -> ProgressDisplay:
        if self._lines:
            self._lines.__enter__()
        else:
            self._live = _live_display(self.kind)
            if self.kind != "bytes":  # an upload's task starts with its first file
                description = f"{self.title}: sync" if self.kind == "steps" else self.title
                self._task = self._live.add_task(description, total=None, note="")
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lines:
            self._lines.__exit__(*exc)
        else:
            self._live.stop()

    def update(
        self, stage: str | None, done: int | None = None, total: int | None = None, note: str = ""
    ) -> None:
        """The latest state: ``stage`` None keeps the stage; ``note`` is the tool's line (an
        activity's, a build's) or the file being sent."""
        if self._lines:
            self._lines.update(*self._line_state(stage, done, total, note))
        elif self.kind == "activity":
            self._live.update(self._task, note=note[-100:])
        elif self.kind == "steps":
            fields = {"total": total, "completed": done or 0} if total else {}
            description = f"{self.title}: {stage}"
            self._live.update(self._task, description=description, note=note[-70:], **fields)
        else:
            if self._task is None:
                self._task = self._live.add_task(note, total=total, note="")
            self._live.update(self._task, completed=done, description=note[-40:])

    def _line_state(
        self, stage: str | None, done: int | None, total: int | None, note: str
    ) -> tuple[str | None, str]:
        if self.kind == "steps":
            return stage, f"[{done}/{total}]" if total else ""
        if self.kind == "bytes":
            return (
                stage,
                f"{(done or 0) * 100 // max(total or 0, 1)}% ({done}/{total} bytes) {note}",
            )
        phase = GIT_PHASE.match(note)
        return (phase["stage"], phase["fraction"]) if phase else (None, note)  # a line whole: a
        # cut word reads as garbage


def _live_display(kind: str) -> Any:
    """rich's live display for a ProgressDisplay of ``kind``, on stderr, gone when it stops."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    description = TextColumn("{task.description}", markup=False)
    note = TextColumn("{task.fields[note]}", style="dim", markup=False)
    columns = {
        "activity": (SpinnerColumn(), description, note),
        "steps": (
            SpinnerColumn(),
            description,
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            note,
        ),
        "bytes": (
            description,
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        ),
    }[kind]
    return Progress(*columns, console=rich_console(stderr=True), transient=True)


@contextmanager
def activity(message: str) -> Iterator[Callable[[str], None]]:
    """A spinner whose text follows the latest progress line of a long operation; in logs and
    pipes, ProgressLines with git's phase and fraction."""
    with ProgressDisplay(message, "activity") as display:

        def follow(line: str) -> None:
            if line.strip():
                display.update(None, note=line.strip())

        yield follow


@contextmanager
def build_progress(title: str) -> Iterator[Callable[[BuildEvent], None]]:
    """A live bar fed by ninja's [n/N] lines; in logs and pipes, ProgressLines."""
    with ProgressDisplay(title, "steps") as display:
        yield lambda event: display.update(event.stage, event.done, event.total, event.line.strip())


@contextmanager
def transfer_progress(enabled: bool) -> Iterator[Callable[[TransferProgress], None] | None]:
    """A bar with bytes and rate for an upload (in logs and pipes, ProgressLines); nothing when
    ``enabled`` is false."""
    if not enabled:
        yield None
        return
    with ProgressDisplay("upload", "bytes") as display:
        yield lambda event: display.update("sending", event.done, event.total, event.label)


def command_group(name: str, help_text: str) -> typer.Typer:
    """A group of subcommands (``kzbuild patches ...``), with the same help style as the top
    level."""
    return typer.Typer(
        name=name,
        help=help_text,
        no_args_is_help=True,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def report_bug(exc: BaseException) -> None:
    """An exception kzbuild did not expect: one line and where to look, the traceback only with
    -vv."""
    say(
        styled("bold red", "internal error (a kzbuild bug):"),
        f" {type(exc).__name__}: {exc}",
        err=True,
    )
    if tracebacks_wanted():
        err_console.print_exception()
    else:
        say(styled("yellow", "hint:"), " rerun with -vv for the traceback and report it", err=True)


def report_error(exc: KzError) -> None:
    # messages carry paths, argv and env values, printed as they are
    say(styled("bold red", "error:"), f" {proc.redact(exc.message)}", err=True)
    if exc.hint:
        say(styled("yellow", "hint:"), f" {proc.redact(exc.hint)}", err=True)
    if tracebacks_wanted():
        err_console.print_exception()


def report_interrupted() -> None:
    say(styled("red", "interrupted"), err=True)
