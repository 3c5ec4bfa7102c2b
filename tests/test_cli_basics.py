from kzbuild import __version__
from tests.fixtures_build import tiny  # noqa: F401


def test_version(kz):
    result = kz("--version")
    assert result.code == 0
    assert __version__ in result.out


def test_help_lists_commands(kz):
    result = kz("--help")
    assert result.code == 0
    for command in ("sync", "status", "recipes", "bump", "build", "doctor", "ci", "deploy", "run", "bench",
                    "patches", "models", "results", "cache"):
        assert f" {command} " in result.out


def test_every_command_has_help(kz):
    for command in (["sync"], ["patches", "check"], ["build"], ["deploy"], ["bench"], ["results", "compare"], ["models", "tiny"], ["cache", "stats"]):
        result = kz(*command, "--help")
        assert result.code == 0, command
        assert "Usage:" in result.out


def test_usage_error_exits_2_without_traceback(kz):
    result = kz("sync", "--no-such-option")
    assert result.code == 2
    assert "No such option" in result.err and "Traceback" not in result.err


def every_command(group=None, path=()):
    """Each command's argv path, subcommands included."""
    from typer.main import get_command

    from kzbuild.cli import app

    group = group or get_command(app)
    for name, command in sorted(getattr(group, "commands", {}).items()):
        yield (*path, name)
        yield from every_command(command, (*path, name))


def description_lines(help_text: str) -> list[str]:
    """The rendered description: the lines between the usage line and the first panel."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next((i for i, line in enumerate(lines) if line.startswith("╭")), len(lines))
    return [line.strip() for line in lines[start:end]]


def test_help_paragraphs_wrap_only_where_the_next_word_does_not_fit(kz, monkeypatch):
    """At 80 columns a description line ends early only at a paragraph's end: a line break in
    a docstring paragraph would show as a line cut mid-sentence."""
    monkeypatch.setenv("COLUMNS", "80")
    text_width = 78  # rich pads the description by one column on each side
    checked = 0
    for command in every_command():
        result = kz(*command, "--help")
        assert result.code == 0, command
        lines = description_lines(result.out)
        for line, following in zip(lines, lines[1:], strict=False):
            if line and following:
                checked += 1
                assert len(line) + 1 + len(following.split()[0]) > text_width, (command, line, following)
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
