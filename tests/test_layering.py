"""Imports run one way: model <- adapters and capabilities <- cli. A producer never imports its consumer."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "kzbuild"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kzbuild_imports(path: Path) -> set[str]:
    """The kzbuild modules ``path`` imports, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("kzbuild")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("kzbuild"):
            found.add(node.module)
            # "from kzbuild import deploy" imports the module kzbuild.deploy
            found |= {f"{node.module}.{alias.name}" for alias in node.names if (PACKAGE.parent / node.module.replace(".", "/") / f"{alias.name}.py").is_file()}
    return found


GRAPH = {module_name(path): kzbuild_imports(path) for path in PACKAGE.rglob("*.py")}


def test_the_model_imports_only_the_model_and_the_errors():
    for module, imports in GRAPH.items():
        if module.startswith("kzbuild.model"):
            assert all(name.startswith("kzbuild.model") or name == "kzbuild.errors" or name == "kzbuild" for name in imports), (module, imports)


def test_only_the_cli_imports_the_cli():
    for module, imports in GRAPH.items():
        if not module.startswith("kzbuild.cli") and module != "kzbuild.__main__":
            assert not any(name.startswith("kzbuild.cli") for name in imports), (module, imports)


def test_build_does_not_import_what_consumes_its_artifacts():
    consumers = {"kzbuild.deploy", "kzbuild.bench", "kzbuild.run", "kzbuild.results"}
    assert not GRAPH["kzbuild.build"] & consumers
