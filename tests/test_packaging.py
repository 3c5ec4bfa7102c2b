"""A clean install works: every module kzbuild imports is the standard library's, kzbuild's own,
or comes from a distribution that pyproject.toml declares (typer's vendored click is not click)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

from kzbuild.cli import main
from tests.conftest import REPO_ROOT


def imported_top_level_modules(package: Path) -> dict[str, str]:
    """Top-level module name -> one file that imports it (absolute imports only)."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(package.parent)))
    return found


def declared_distributions() -> set[str]:
    requirements = importlib.metadata.requires("kzbuild") or []
    runtime = [req for req in requirements if "extra ==" not in req]
    return {
        re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-") for req in runtime
    }


def test_every_import_is_stdlib_own_or_declared():
    providers = importlib.metadata.packages_distributions()
    declared = declared_distributions()
    undeclared = {}
    for module, where in imported_top_level_modules(REPO_ROOT / "kzbuild").items():
        if module in sys.stdlib_module_names or module in ("kzbuild", "__future__"):
            continue
        dists = {dist.lower().replace("_", "-") for dist in providers.get(module, [])}
        if not dists & declared:
            undeclared[module] = (where, sorted(dists))
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_declared_names_are_what_the_checker_reads():
    assert {"typer", "gitpython", "rich", "pyyaml", "paramiko"} <= declared_distributions()


def test_a_usage_error_is_exit_2_without_a_traceback(capsys):
    assert main(["sync", "--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert "No such option" in err and "Traceback" not in err


def test_an_eof_error_escaping_a_command_is_reported_as_a_bug_not_as_ctrl_c(capsys, monkeypatch):
    from kzbuild.cli import INTERNAL_ERROR
    from kzbuild.source import recipes

    def dropped(*args, **kwargs):
        raise EOFError("connection closed")

    monkeypatch.setattr(recipes, "list_recipes", dropped)
    assert main(["recipes"]) == INTERNAL_ERROR
    err = capsys.readouterr().err
    assert "internal error" in err and "EOFError" in err and "interrupted" not in err
