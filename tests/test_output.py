"""Every command speaks through kzbuild.cli.ui, under one rule: styles on a terminal or with
FORCE_COLOR, never with NO_COLOR, and never in a pipe."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_basics import every_command

ROOT = Path(__file__).resolve().parent.parent

# commands that run with no argument in an empty project, printing a line or a table
NO_ARGUMENT = [
    ("status",),
    ("recipes",),
    ("patches", "list"),
    ("patches", "lint"),
    ("cache", "stats"),
    ("device", "list"),
    ("results", "list"),
    ("results", "check"),
]


def invocations():
    """Each command with an argument it cannot take (a usage error, or an error naming a recipe
    or result that does not exist), its help, and the commands that print without arguments."""
    for command in every_command():
        yield (*command, "nosuch")
        yield (*command, "--help")
    yield from NO_ARGUMENT


def run_all(kz, project):
    project.recipe("demo-host", commit="0" * 40, sources=["git: file:///nowhere"])
    return {args: kz(*args) for args in invocations()}


@pytest.mark.parametrize(
    "env",
    [{}, {"NO_COLOR": "1"}, {"NO_COLOR": "1", "FORCE_COLOR": "1"}, {"TERM": "dumb"}],
    ids=["pipe", "no-color", "no-color-wins-over-force-color", "dumb"],
)
def test_no_styles_in_a_pipe_or_with_no_color(kz, project, monkeypatch, env):
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for args, result in run_all(kz, project).items():
        assert "\x1b" not in result.out + result.err, args
        assert result.out + result.err, args  # each said something
        assert "Traceback" not in result.err, args


def test_force_color_styles_every_error_line_the_same_way(kz, project, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    results = run_all(kz, project)
    errors = [r for r in results.values() if "error:" in r.err]
    assert len(errors) > 10
    for result in errors:
        assert (
            result.err.startswith("\x1b[1;31merror:\x1b[0m ") or "\n\x1b[1;31merror:" in result.err
        )
    # help and usage errors are click's plain text
    assert "\x1b" not in results[("build", "--help")].out


def test_no_color_wins_over_force_color_in_a_fresh_process(project):
    """rich, left to itself, drops colours under NO_COLOR but keeps bold when FORCE_COLOR is set."""
    env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "kzbuild", "--project", str(project.root), "sync", "nosuch"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: no recipe named 'nosuch'")


@pytest.mark.parametrize(
    ("kind", "updates", "shown"),
    [
        ("activity", [(None, None, None, "Receiving objects:  57% (81/141)")], "57% (81/141)"),
        ("steps", [("build", 3, 140, "[3/140] Building C object a.o")], "tiny: build"),
        ("bytes", [("sending", 512, 2048, "bin/llama-bench")], "bin/llama-bench"),
    ],
)
def test_on_a_terminal_progress_is_rich_live_display_that_leaves_no_line(
    capsys, monkeypatch, kind, updates, shown
):
    from kzbuild.cli import ui

    monkeypatch.setattr(ui, "stderr_is_terminal", lambda: True)
    monkeypatch.setenv("FORCE_COLOR", "1")  # the console draws as on a terminal
    monkeypatch.delenv("NO_COLOR", raising=False)
    with ui.ProgressDisplay("tiny", kind) as display:
        for stage, done, total, note in updates:
            display.update(stage, done, total, note)
    err = capsys.readouterr().err
    assert shown in err and "\x1b[2K" in err  # drawn, then erased (transient)
    assert "Z tiny:" not in err  # no ProgressLines


def test_only_ui_imports_rich_or_writes_to_the_streams():
    """The commands print through kzbuild.cli.ui alone, so one rule styles every line."""
    for path in sorted((ROOT / "kzbuild" / "cli").glob("*.py")):
        if path.name == "ui.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("rich"), where
            elif isinstance(node, ast.Import):
                assert not any(alias.name.startswith("rich") for alias in node.names), where
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", where
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert (node.value.id, node.attr) not in {
                    ("sys", "stdout"),
                    ("sys", "stderr"),
                    ("typer", "echo"),
                    ("typer", "secho"),
                }, where
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not re.search(r"\[/?(bold|dim|red|green|yellow|cyan)\b", node.value), where
