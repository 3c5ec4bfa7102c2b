import subprocess
import sys

import pytest
import typer

from kzbuild import __version__


def test_version(kz):
    result = kz("--version")
    assert result.code == 0
    assert __version__ in result.out


def test_help_lists_commands(kz):
    result = kz("--help")
    assert result.code == 0
    for command in (
        "sync",
        "status",
        "recipes",
        "bump",
        "build",
        "doctor",
        "ci",
        "deploy",
        "run",
        "bench",
        "patches",
        "models",
        "results",
        "cache",
    ):
        assert f" {command} " in result.out


def test_every_command_has_help(kz):
    for command in (
        ["sync"],
        ["patches", "check"],
        ["build"],
        ["deploy"],
        ["bench"],
        ["results", "compare"],
        ["models", "tiny"],
        ["cache", "stats"],
    ):
        result = kz(*command, "--help")
        assert result.code == 0, command
        assert "Usage:" in result.out


def test_usage_error_exits_2_without_traceback(kz):
    result = kz("sync", "--no-such-option")
    assert result.code == 2
    assert "No such option" in result.err and "Traceback" not in result.err


@pytest.mark.parametrize(
    ("typed", "suggested"), [("synk", "'sync'"), ("stat", "'status'"), ("reslts", "'results'")]
)
def test_a_mistyped_command_exits_2_naming_the_close_ones(kz, typed, suggested):
    result = kz(typed, "demo-host")
    assert result.code == 2
    assert f"Error: No such command '{typed}'. Did you mean {suggested}?" in result.err
    assert "Traceback" not in result.err


def test_a_word_close_to_no_command_gets_no_suggestion(kz):
    result = kz("xyzzy")
    assert result.code == 2 and "Error: No such command 'xyzzy'.\n" in result.err


def every_command(group=None, path=()):
    """Each command's argv path, subcommands included."""
    from typer.main import get_command

    from kzbuild.cli import app

    group = group or get_command(app)
    if not hasattr(group, "list_commands"):
        return
    context = typer.Context(group)
    for name in group.list_commands(context):
        yield (*path, name)
        yield from every_command(group.get_command(context, name), (*path, name))


def description_lines(help_text: str) -> list[str]:
    """The rendered description: the lines between the usage line and the first section."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next(
        (i for i, line in enumerate(lines) if line in ("Arguments:", "Options:", "Commands:")),
        len(lines),
    )
    return [line.strip() for line in lines[start:end]]


def test_help_paragraphs_wrap_only_where_the_next_word_does_not_fit(kz, monkeypatch):
    """At 80 columns a description line ends early only at a paragraph's end: a line break in
    a docstring paragraph would show as a line cut mid-sentence."""
    monkeypatch.setenv("COLUMNS", "80")
    text_width = 76  # click wraps at 78 columns (COLUMNS - 2) and indents the description by 2
    checked = 0
    for command in every_command():
        result = kz(*command, "--help")
        assert result.code == 0, command
        lines = description_lines(result.out)
        for line, following in zip(lines, lines[1:], strict=False):
            if line and following:
                checked += 1
                assert len(line) + 1 + len(following.split()[0]) > text_width, (
                    command,
                    line,
                    following,
                )
    assert checked > 10


def test_v_logs_each_external_command_as_info_and_no_flag_logs_none(tiny, kz):
    quiet = kz("sync", "tiny")
    assert quiet.code == 0, quiet.err
    assert "$ " not in quiet.err
    verbose = kz("-v", "status", "tiny")
    assert verbose.code == 0, verbose.err
    commands = [line for line in verbose.err.splitlines() if "$ " in line and "git" in line]
    assert commands and all(line.lstrip().startswith("INFO") for line in commands), verbose.err
    assert "DEBUG" not in verbose.err


def test_the_command_table_matches_the_commands():
    """`kzbuild --help` lists commands from a table without loading them: each line must be the
    command's own help, and every command a cli module registers must be in the table."""
    from kzbuild.cli import COMMANDS, commands_of

    for name, (module, line) in COMMANDS.items():
        command = commands_of(module)[name]
        assert " ".join((command.help or "").split("\n\n")[0].split()) == line, (
            name
        )  # as click joins it
        assert set(commands_of(module)) <= set(COMMANDS), module


def test_help_loads_no_command_module():
    code = (
        "import sys; from kzbuild.cli import main; main(['--help']); print(sorted(m for m in "
        "sys.modules if m.startswith('kzbuild.')))"
    )
    listed = (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    assert listed == "['kzbuild.cli', 'kzbuild.errors']"
