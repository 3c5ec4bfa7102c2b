"""Load and validate recipes (``recipes/*.yaml``).

Every error names the file, the line and the key. Paths in a recipe are relative to the
project root.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import cast

from kzbuild.adapters import yamlconf
from kzbuild.errors import ConfigError
from kzbuild.model.recipe import (
    SOURCE_KINDS,
    BuildSection,
    Overlay,
    Recipe,
    Source,
    SourceKind,
    Upstream,
)
from kzbuild.source.stack.series import read_series

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
RECIPE_KEYS = ("description", "upstream", "patches", "overlays", "build", "device")
UPSTREAM_KEYS = ("remote", "commit", "sources")
BUILD_KEYS = ("targets", "tools", "cmake")
DEFAULT_SERIES = "patches/series"


def recipe_path(recipes_dir: Path, name_or_path: str) -> Path:
    """Resolve ``pad3-v79``, ``archive/x`` or a path to a recipe file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate.resolve()
    for suffix in (".yaml", ".yml"):
        path = recipes_dir / f"{name_or_path}{suffix}"
        if path.is_file():
            return path.resolve()
    known = ", ".join(list_recipes(recipes_dir)) or "none"
    raise ConfigError(
        f"no recipe named '{name_or_path}' in {recipes_dir}", hint=f"known recipes: {known}"
    )


def list_recipes(recipes_dir: Path) -> list[str]:
    names = []
    for path in sorted(recipes_dir.rglob("*.y*ml")):
        if path.suffix in (".yaml", ".yml") and path.name != "devices.yaml":
            names.append(path.relative_to(recipes_dir).with_suffix("").as_posix())
    return names


def load_recipe(project: Path, name_or_path: str) -> Recipe:
    path = recipe_path(project / "recipes", name_or_path)
    try:
        name = path.relative_to((project / "recipes").resolve()).with_suffix("").as_posix()
    except ValueError:
        name = path.stem
    return parse_recipe(yamlconf.load(path), name=name, project=project)


def parse_recipe(doc: yamlconf.Mapping, *, name: str, project: Path) -> Recipe:
    doc.check_keys(RECIPE_KEYS, required=("upstream",), context="recipe")
    upstream = _parse_upstream(doc.get_mapping("upstream"))

    series_rel = doc.get_path("patches", DEFAULT_SERIES)
    assert series_rel is not None
    series_path = (project / series_rel).resolve()
    if not series_path.is_file():
        raise doc.error(
            "patches" if "patches" in doc else None, f"series file '{series_rel}' does not exist"
        )
    series = read_series(series_path)

    overlays = _parse_overlays(doc.get_list("overlays"), project)
    build = _parse_build(doc.get_mapping("build"))
    return Recipe(
        name=name,
        path=doc.path,
        description=doc.get_str("description", "") or "",
        upstream=upstream,
        series=series.path,
        overlays=overlays,
        build=build,
        device=doc.get_str("device"),
    )


def _parse_upstream(section: yamlconf.Mapping) -> Upstream:
    section.check_keys(UPSTREAM_KEYS, required=("commit",), context="upstream")
    commit = section.get_str("commit") or ""
    if not SHA_RE.match(commit):
        raise section.error(
            "commit",
            f"'{commit}' is not a full 40-hex commit sha",
            hint="pin the full sha, not a short one or a branch",
        )
    remote = section.get_str("remote", "") or ""
    sources: list[Source] = []
    entries = section.get_list("sources")
    for index, entry in enumerate(entries):
        if not isinstance(entry, yamlconf.Mapping) or len(entry) != 1:
            raise entries.error(
                index,
                f"a source is a one-key mapping, one of: {', '.join(SOURCE_KINDS)}",
                key="upstream.sources",
            )
        entry.check_keys(SOURCE_KINDS, context="upstream.sources")
        ((kind, location),) = entry.items()
        if not isinstance(location, str) or not location:
            raise entry.error(kind, "must be a non-empty string")
        if kind == "pypi-sdist" and "==" not in location:
            raise entry.error(
                kind, f"'{location}' must pin a version, like llama-cpp-python==0.3.36"
            )
        sources.append(
            Source(kind=cast(SourceKind, kind), location=location)
        )  # check_keys admitted only SOURCE_KINDS
    if not sources:
        if not remote:
            raise section.error(None, "needs a remote or a list of sources")
        sources.append(Source(kind="git", location=remote))
    return Upstream(remote=remote or sources[0].location, commit=commit, sources=tuple(sources))


def _parse_overlays(entries: yamlconf.Sequence, project: Path) -> tuple[Overlay, ...]:
    overlays = []
    dests: set[str] = set()
    for index, entry in enumerate(entries):
        if not isinstance(entry, yamlconf.Mapping):
            raise entries.error(index, "an overlay is a mapping with src and dest", key="overlays")
        entry.check_keys(("src", "dest"), required=("src", "dest"), context="overlay")
        src_rel, dest = entry.get_path("src") or "", entry.get_path("dest") or ""
        src = (project / src_rel).resolve()
        if not src.is_file():
            raise entry.error("src", f"overlay source '{src_rel}' does not exist")
        pure = PurePosixPath(dest)
        if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] == ".git":
            raise entry.error("dest", f"overlay target '{dest}' escapes the source tree")
        if dest in dests:
            raise entry.error("dest", f"overlay target '{dest}' is named twice")
        dests.add(dest)
        overlays.append(Overlay(src=src, dest=pure.as_posix()))
    return tuple(overlays)


def _parse_build(section: yamlconf.Mapping) -> BuildSection:
    section.check_keys(BUILD_KEYS, context="build")
    defaults = BuildSection()
    targets = section.get_str_list("targets") or defaults.targets
    tools = section.get_str_list("tools") or defaults.tools
    return BuildSection(targets=targets, tools=tools, cmake=section.get_options("cmake"))
