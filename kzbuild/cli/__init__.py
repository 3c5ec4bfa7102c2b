"""The command line: thin typer commands over the capability modules.

This package is the only place that talks to the terminal. ``main()`` turns every KzError
into its message and exit code; a traceback shows only with ``-vv``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from kzbuild import __version__
from kzbuild.cli import bench as bench_commands
from kzbuild.cli import build as build_commands
from kzbuild.cli import cache as cache_commands
from kzbuild.cli import deploy as deploy_commands
from kzbuild.cli import device as device_commands
from kzbuild.cli import models as models_commands
from kzbuild.cli import patches as patches_commands
from kzbuild.cli import sync as sync_commands
from kzbuild.cli.ui import Context, console, err_console, resolve_settings, setup_logging, tracebacks_wanted
from kzbuild.errors import KzError
from kzbuild.proc import redact

INTERNAL_ERROR = 70  # EX_SOFTWARE: an exception kzbuild has no class for is a bug
INTERRUPTED = 130  # 128 + SIGINT, as shells report it

app = typer.Typer(
    name="kzbuild",
    help="Sync, patch, build, deploy and benchmark llama.cpp for Snapdragon devices (Hexagon NPU).",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

for module in (sync_commands, patches_commands, build_commands, cache_commands, deploy_commands, device_commands, models_commands, bench_commands):
    module.register(app)


def _version(value: bool) -> None:
    if value:
        console.print(f"kzbuild {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="-v logs every external command; -vv adds debug detail and tracebacks.")] = 0,
    project: Annotated[Optional[Path], typer.Option(help="Project root (default: nearest folder with recipes/; env KZ_PROJECT).")] = None,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Shared cache for upstream objects and sdists (env KZ_CACHE_DIR; default XDG cache).")] = None,
    work_dir: Annotated[Optional[Path], typer.Option(help="Worktrees and artifacts (env KZ_WORK_DIR; default PROJECT/.kz).")] = None,
    results_dir: Annotated[Optional[Path], typer.Option(help="Results database and JSONL (env KZ_RESULTS_DIR; default PROJECT/results).")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    setup_logging(verbose)
    ctx.obj = Context(
        verbose=verbose,
        settings_factory=lambda: resolve_settings(ctx.params),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app and map errors to exit codes. Returns the code when argv is given."""
    try:
        returned = app(args=argv, prog_name="kzbuild", standalone_mode=False)
        code = returned if isinstance(returned, int) else 0
    except KzError as exc:
        report_error(exc)
        code = exc.exit_code
    except (KeyboardInterrupt, typer.Abort) as exc:
        # click turns Ctrl-C, and any EOFError, into Abort; kzbuild never prompts, so an
        # EOFError (a dropped connection a transport missed) is a bug to show, not a Ctrl-C
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, EOFError):
            report_bug(cause)
            code = INTERNAL_ERROR
        else:
            err_console.print("[red]interrupted[/red]")
            code = INTERRUPTED
    except typer.Exit as exc:
        code = exc.exit_code
    except Exception as exc:
        if _is_click_error(exc):
            exc.show()  # type: ignore[attr-defined]
            # usage errors are 2; click's generic ClickException (a file option that cannot be opened) says 1
            code = max(int(getattr(exc, "exit_code", 2)), 2)
        else:
            report_bug(exc)
            code = INTERNAL_ERROR
    if argv is not None:
        return code
    sys.exit(code)


def _is_click_error(exc: Exception) -> bool:
    """click's usage errors, whether from click itself or the copy that typer vendors (typer._click):
    matched by class name so kzbuild needs no import of either."""
    return any(cls.__name__ == "ClickException" for cls in type(exc).__mro__) and hasattr(exc, "show")


def report_bug(exc: Exception) -> None:
    """An exception kzbuild did not expect: one line and where to look, the traceback only with -vv."""
    err_console.print(f"[bold red]internal error (a kzbuild bug):[/bold red] {escape(type(exc).__name__)}: {escape(str(exc))}", highlight=False)
    if tracebacks_wanted():
        err_console.print_exception()
    else:
        err_console.print("[yellow]hint:[/yellow] rerun with -vv for the traceback and report it", highlight=False)


def report_error(exc: KzError) -> None:
    # messages carry paths, argv and env values: brackets in them are text, not markup
    err_console.print(f"[bold red]error:[/bold red] {escape(redact(exc.message))}", highlight=False, markup=True)
    if exc.hint:
        err_console.print(f"[yellow]hint:[/yellow] {escape(redact(exc.hint))}", highlight=False)
    if tracebacks_wanted():
        err_console.print_exception()
