from kzbuild import __version__


def test_version(kz):
    result = kz("--version")
    assert result.code == 0
    assert __version__ in result.out


def test_help_lists_commands(kz):
    result = kz("--help")
    assert result.code == 0
    for command in ("sync", "status", "recipes", "bump", "build", "doctor", "ci", "deploy", "run", "bench",
                    "patches", "models", "results"):
        assert f" {command} " in result.out


def test_every_command_has_help(kz):
    for command in (["sync"], ["patches", "check"], ["build"], ["deploy"], ["bench"], ["results", "compare"], ["models", "tiny"]):
        result = kz(*command, "--help")
        assert result.code == 0, command
        assert "Usage:" in result.out


def test_usage_error_exits_2_without_traceback(kz):
    result = kz("sync", "--no-such-option")
    assert result.code == 2
    assert "No such option" in result.err and "Traceback" not in result.err
