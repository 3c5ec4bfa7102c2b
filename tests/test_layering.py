"""Imports run one way, package by package: model <- adapters <- source <- build <- device <-
measure <- cli.

A producer never imports its consumer, and nothing imports a layer above its own."""

from __future__ import annotations

import ast
import re
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
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.startswith("kzbuild")
        ):
            found.add(node.module)
            # "from kzbuild import deploy" imports the module kzbuild.device.deploy
            found |= {
                f"{node.module}.{alias.name}"
                for alias in node.names
                if (PACKAGE.parent / node.module.replace(".", "/") / f"{alias.name}.py").is_file()
            }
    return found


GRAPH = {module_name(path): kzbuild_imports(path) for path in PACKAGE.rglob("*.py")}


def test_the_model_imports_only_the_model_and_the_errors():
    for module, imports in GRAPH.items():
        if module.startswith("kzbuild.model"):
            assert all(
                name.startswith("kzbuild.model") or name == "kzbuild.errors" or name == "kzbuild"
                for name in imports
            ), (module, imports)


def test_only_the_cli_imports_the_cli():
    for module, imports in GRAPH.items():
        if not module.startswith("kzbuild.cli") and module != "kzbuild.__main__":
            assert not any(name.startswith("kzbuild.cli") for name in imports), (module, imports)


def test_build_does_not_import_what_consumes_its_artifacts():
    consumers = {
        "kzbuild.device.deploy",
        "kzbuild.measure.bench",
        "kzbuild.device.run",
        "kzbuild.measure.resultsdb",
    }
    assert not GRAPH["kzbuild.build.builder"] & consumers


# The packages along the data's way, lowest first: a module imports only its own layer and those
# below.
# ci and doctor are workflows across the whole path; a new top-level module must be placed here.
LAYERS = ["model", "adapters", "source", "build", "device", "measure", "workflows", "cli"]
RANK = {name: rank for rank, name in enumerate(LAYERS)}
WORKFLOWS = {"ci", "doctor"}


def layer(module: str) -> str:
    parts = module.split(".")
    if module in ("kzbuild", "kzbuild.errors"):
        return "model"
    if parts[1] == "__main__":
        return "cli"
    if parts[1] in WORKFLOWS:
        return "workflows"
    assert parts[1] in RANK, f"{module}: place its package in a layer of tests/test_layering.py"
    return parts[1]


def test_the_top_level_holds_only_packages_errors_and_workflows():
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__", "errors"} | WORKFLOWS, top


def test_no_module_name_repeats_across_packages_unless_it_is_one_concepts_layers():
    """model/X, cli/X and a capability's X are one concept's layers; any other repeat misleads."""
    by_name: dict[str, list[str]] = {}
    for module in GRAPH:
        parts = module.split(".")
        if len(parts) > 2 and parts[-1] != "__init__":
            by_name.setdefault(parts[-1], []).append(parts[1])
    clashes = {
        name: packages
        for name, packages in by_name.items()
        if len([p for p in packages if p not in ("model", "cli")]) > 1
    }
    assert not clashes, clashes


def test_no_import_alias_dodges_a_module_name():
    aliased = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("kzbuild")
            ):
                aliased += [
                    (path.name, alias.name)
                    for alias in node.names
                    if alias.asname
                    and alias.asname != alias.name
                    and (
                        PACKAGE.parent / node.module.replace(".", "/") / f"{alias.name}.py"
                    ).is_file()
                ]
    assert not aliased, aliased


def test_imports_never_reach_a_higher_layer():
    upward = [
        (module, name)
        for module, imports in GRAPH.items()
        for name in imports
        if name in GRAPH and RANK[layer(name)] > RANK[layer(module)]
    ]
    assert not upward, upward


def test_the_patch_stack_is_one_package():
    stack_modules = {m for m in GRAPH if m.startswith("kzbuild.source.stack.")}
    assert {
        f"kzbuild.source.stack.{name}"
        for name in ("series", "patchfile", "apply", "check", "export", "bump")
    } <= stack_modules


# The transports and the device store are adapters of the device package: their own types stay
# with them.
DEVICE_ADAPTERS = {
    f"kzbuild.device.{name}"
    for name in (
        "base",
        "local",
        "ssh",
        "adb",
        "registry",
        "store",
        "chunkstore",
        "integrity",
        "devicelock",
        "steps",
    )
}


def test_dataclasses_that_cross_modules_live_in_the_model():
    """A dataclass defined outside model/ is used only where it is defined (adapters' own types
    excepted)."""
    crossing = []
    defined = {}
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        if layer(module) in ("model", "adapters", "cli") or module in DEVICE_ADAPTERS:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(d, ast.Name) and d.id == "dataclass")
                or (isinstance(d, ast.Call) and getattr(d.func, "id", "") == "dataclass")
                for d in node.decorator_list
            ):
                defined[node.name] = module
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                crossing += [
                    (module, alias.name)
                    for alias in node.names
                    if defined.get(alias.name) == node.module
                ]
    assert not crossing, crossing


def test_the_architecture_page_s_layout_names_every_module():
    page = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = page.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"[`/]([a-z0-9_]+)\.py`", table))
    unnamed = [
        module
        for module in GRAPH
        if module.rsplit(".", 1)[-1] not in named | {"kzbuild", "__main__", *LAYERS, "stack"}
    ]
    assert not unnamed, unnamed


def test_all_git_goes_through_gitcmd():
    """gitcmd isolates git from the user's config; a call around it would not be."""
    direct = [
        path.name
        for path in PACKAGE.rglob("*.py")
        if path.name != "gitcmd.py"
        and re.search(r"\(\[\s*\"git\"", path.read_text(encoding="utf-8"))  # run(["git", ...
    ]
    assert not direct, direct


def test_one_sha256_helper():
    defined = [
        path.name
        for path in PACKAGE.rglob("*.py")
        if "def sha256_file(" in path.read_text(encoding="utf-8")
    ]
    assert defined == ["files.py"], defined
