"""The command line: thin typer commands over the capability modules.

This package is the only place that talks to the terminal. ``main()`` turns every KzError
into its message and exit code; a traceback shows only with ``-vv``.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from typer.core import TyperGroup

from kzbuild import __version__
from kzbuild.errors import KzError, unwritable

if TYPE_CHECKING:  # typer's vendored click, for the types only
    from typer._click import Command, HelpFormatter
    from typer._click import Context as ClickContext
    from typer._click.shell_completion import CompletionItem

INTERNAL_ERROR = 70  # EX_SOFTWARE: an exception kzbuild has no class for is a bug
INTERRUPTED = 130  # 128 + SIGINT, as shells report it

# Each command: the cli module that registers it, and its line in `kzbuild --help`. A command's
# module (and what it imports) loads only when that command runs, so start-up pays for one command;
# tests/test_cli_basics.py checks each line against the command's own help.
COMMANDS: dict[str, tuple[str, str]] = {
    "sync": (
        "kzbuild.cli.sync",
        "Fetch the pinned upstream commit, apply the patch series as commits, overlay kernels/, "
        "write the lock.",
    ),
    "status": (
        "kzbuild.cli.sync",
        "Show the pin, the source used, applied patches and the worktree state of a recipe.",
    ),
    "recipes": ("kzbuild.cli.sync", "List the recipes of this project."),
    "patches": (
        "kzbuild.cli.patches",
        "The patch stack (patches/series): list, lint, check against upstream, export from the "
        "worktree, edit.",
    ),
    "bump": (
        "kzbuild.cli.patches",
        "Check the patch stack against a newer upstream commit, and move the recipe's pin there.",
    ),
    "roll": (
        "kzbuild.cli.roll",
        "Try newer upstream commits: verdict per patch, who broke each conflict (PR, author, "
        "date), build, Kz-Tests, v79 plan; the newest that passes is rollable.",
    ),
    "build": (
        "kzbuild.cli.build",
        "Build llama.cpp for a target into .kz/artifacts/<build-id>/ (bin/, lib/, manifest.json); "
        "reuse it when the id exists.",
    ),
    "cache": (
        "kzbuild.cli.cache",
        "The build caches: this machine's ccache and artifacts, and the remote cache shared "
        "between machines.",
    ),
    "doctor": (
        "kzbuild.cli.doctor",
        "Check the toolchains, cmake, ninja and ccache a target needs, naming the file that proved "
        "each version.",
    ),
    "ci": (
        "kzbuild.cli.ci",
        "Sync, check the patches, build each target whose toolchain is here (others: skipped, with "
        "why); print a JSON summary.",
    ),
    "deploy": (
        "kzbuild.cli.deploy",
        "Deploy a build to a device: only contents it lacks are sent, then `current` switches in "
        "one rename.",
    ),
    "device": (
        "kzbuild.cli.device",
        "Devices: list them with their pools and lock holders, check what is stored on one and the "
        "space it holds.",
    ),
    "models": (
        "kzbuild.cli.models",
        "Model files: generate tiny test models, store models on devices.",
    ),
    "run": (
        "kzbuild.cli.run",
        "Run TOOL from the device's current release with the device env; exits with the tool's "
        "code.",
    ),
    "bench": (
        "kzbuild.cli.bench",
        "Run llama-bench -o json on the device and store one record per test with its provenance.",
    ),
    "bisect": (
        "kzbuild.cli.bisect",
        "Find the first upstream commit between --good and --bad that moved a number beyond the "
        "noise.",
    ),
    "ab": (
        "kzbuild.cli.ab",
        "Measure what each patch buys: the full stack against the stack without each live patch, "
        "and bare upstream.",
    ),
    "results": (
        "kzbuild.cli.results",
        "Stored benchmark results: list, show, compare, plot, report, import, check, merge.",
    ),
    "check": (
        "kzbuild.cli.check",
        "Run the Kz-Device-Test checks of the recipe's patches on the device; store each result "
        "with its provenance.",
    ),
    "profile": (
        "kzbuild.cli.profile",
        "Where prefill and decode time goes: per op type its count, time, share of the graph time "
        "and the backend it ran on.",
    ),
}


@cache
def commands_of(module_name: str) -> dict[str, Command]:
    """The commands a cli module registers, imported on first use."""
    sub = typer.Typer(rich_markup_mode=None)
    importlib.import_module(module_name).register(sub)
    return dict(typer.main.get_group(sub).commands)


class LazyCommands(TyperGroup):
    """The top-level group: lists COMMANDS from the table, loads a command's module only to run
    it."""

    def list_commands(self, ctx: ClickContext) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: ClickContext, cmd_name: str) -> Command | None:
        entry = COMMANDS.get(cmd_name)
        return commands_of(entry[0]).get(cmd_name) if entry else None

    def format_commands(self, ctx: ClickContext, formatter: HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, line) for name, (_, line) in COMMANDS.items()])

    def resolve_command(
        self, ctx: ClickContext, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        """A mistyped command is a usage error (exit 2) that names the commands it is close to."""
        name = args[0] if args else ""
        if name and name not in COMMANDS and name[0].isalnum() and not ctx.resilient_parsing:
            close = difflib.get_close_matches(name, COMMANDS, n=3)
            suggestion = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            ctx.fail(f"No such command {name!r}.{suggestion}")
        return super().resolve_command(ctx, args)

    def shell_complete(self, ctx: ClickContext, incomplete: str) -> list[CompletionItem]:
        """Command names from the table, with their help lines: completing ``kzbuild <TAB>`` loads
        no command's module (typer's group would load every one, for its help). Then the root's
        options, as any command completes them."""
        from typer._click.shell_completion import CompletionItem

        names = [
            CompletionItem(name, help=line)
            for name, (_, line) in COMMANDS.items()
            if name.startswith(incomplete)
        ]
        return names + super(TyperGroup, self).shell_complete(ctx, incomplete)


app = typer.Typer(
    name="kzbuild",
    cls=LazyCommands,
    help="Sync, patch, build, deploy and benchmark llama.cpp for Snapdragon devices (Hexagon NPU).",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    pretty_exceptions_enable=False,
    # click's plain help: typer's rich help costs every `--help` ~80 ms of imports
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from kzbuild.cli import ui

        ui.say(f"kzbuild {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    verbose: Annotated[
        int,
        typer.Option(
            "-v",
            "--verbose",
            count=True,
            help="-v logs every external command; -vv adds debug detail and tracebacks.",
        ),
    ] = 0,
    project: Annotated[
        Optional[Path],
        typer.Option(help="Project root (default: nearest folder with recipes/; env KZ_PROJECT)."),
    ] = None,
    cache_dir: Annotated[
        Optional[Path],
        typer.Option(
            help="Shared cache for upstream objects and sdists (env KZ_CACHE_DIR; default XDG "
            "cache)."
        ),
    ] = None,
    work_dir: Annotated[
        Optional[Path],
        typer.Option(help="Worktrees and artifacts (env KZ_WORK_DIR; default PROJECT/.kz)."),
    ] = None,
    results_dir: Annotated[
        Optional[Path],
        typer.Option(
            help="Results database and JSONL (env KZ_RESULTS_DIR; default PROJECT/results)."
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    # imported here, as every module below: `kzbuild --help` needs none of them
    from kzbuild.cli.ui import Context, resolve_settings, setup_logging

    setup_logging(verbose)
    ctx.obj = Context(
        verbose=verbose,
        settings_factory=lambda: resolve_settings(ctx.params),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app and map errors to exit codes. Returns the code when argv is
    given."""
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
            report_interrupted()
            code = INTERRUPTED
    except typer.Exit as exc:
        code = exc.exit_code
    except OSError as exc:  # a read-only or full place is the user's to fix; any other is a bug
        if (error := unwritable(exc)) is not None:
            report_error(error)
            code = error.exit_code
        else:
            report_bug(exc)
            code = INTERNAL_ERROR
    except Exception as exc:
        if _is_click_error(exc):
            exc.show()  # type: ignore[attr-defined]
            # usage errors are 2; click's generic ClickException (a file option that
            # cannot be opened) says 1
            code = max(int(getattr(exc, "exit_code", 2)), 2)
        else:
            report_bug(exc)
            code = INTERNAL_ERROR
    if argv is not None:
        return code
    sys.exit(code)


def _is_click_error(exc: Exception) -> bool:
    """click's usage errors, whether from click itself or the copy that typer vendors
    (typer._click):
    matched by class name so kzbuild needs no import of either."""
    return any(cls.__name__ == "ClickException" for cls in type(exc).__mro__) and hasattr(
        exc, "show"
    )


# the terminal helpers load only when there is something to report (start-up time)
def report_error(exc: KzError) -> None:
    from kzbuild.cli import ui

    ui.report_error(exc)


def report_bug(exc: BaseException) -> None:
    from kzbuild.cli import ui

    ui.report_bug(exc)


def report_interrupted() -> None:
    from kzbuild.cli import ui

    ui.report_interrupted()
