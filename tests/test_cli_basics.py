from kzbuild import __version__


def test_version(kz):
    result = kz("--version")
    assert result.code == 0
    assert __version__ in result.out


def test_help_lists_commands(kz):
    result = kz("--help")
    assert result.code == 0
    for command in ("sync", "status", "recipes"):
        assert command in result.out
