"""Artifacts on this machine: find one by build id or recipe, load and check its manifest.

Shared by build (which writes artifacts and reuses them) and deploy (which sends them), so
neither imports the other.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from kzbuild.adapters.settings import Settings
from kzbuild.errors import ConfigError
from kzbuild.model.artifact import BUILD_ID_RE, BUILD_ID_RULE, MANIFEST, Artifact, parse_files
from kzbuild.model.recipe import Recipe

log = logging.getLogger(__name__)


def recorded_manifests(root: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each readable ``manifest.json`` under an artifacts root, parsed; unreadable ones are
    skipped."""
    for manifest in root.glob(f"*/{MANIFEST}"):
        try:
            doc = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            yield manifest, doc


def existing_artifact(root: Path, build_id: str) -> Artifact | None:
    """The finished artifact of ``build_id``, if one is there and intact."""
    folder = root / build_id
    if not (folder / MANIFEST).is_file():
        return None
    try:
        artifact = load_artifact(folder)
    except ConfigError as exc:
        log.warning("ignoring broken artifact: %s", exc)
        return None
    return artifact if artifact.build_id == build_id else None


@contextmanager
def staged(root: Path, build_id: str) -> Iterator[Path]:
    """The staging folder of ``root/build_id`` (this process's, not yet made): filled in the block
    and
    placed with :func:`publish`; removed when the block fails."""
    staging = root / f".tmp-{build_id}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def manifest_json(manifest: Mapping[str, object]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def publish(staging: Path, manifest: bytes, root: Path, build_id: str) -> Artifact:
    """Write ``manifest`` into ``staging``, check it as every artifact is checked, and rename it to
    ``root/build_id`` in one step: readers see no artifact or a whole one. Another process's
    artifact of the same id that is there first wins (and is returned)."""
    (staging / MANIFEST).write_bytes(manifest)
    artifact = load_artifact(staging)
    try:
        staging.rename(root / build_id)
    except OSError:
        existing = existing_artifact(root, build_id)
        if existing is None:
            raise
        shutil.rmtree(staging)
        return existing
    return replace(artifact, path=artifact.path.with_name(build_id))


def find_artifact(settings: Settings, ref: str | None, recipe: Recipe | None) -> Artifact:
    """``ref`` is a build id under the artifacts dir or a path; without it, the recipe's newest
    artifact."""
    if ref is not None:
        candidates = [Path(ref).expanduser(), settings.artifacts / ref]
        for candidate in candidates:
            if (candidate / MANIFEST).is_file():
                return load_artifact(candidate)
        raise ConfigError(
            f"no artifact '{ref}': neither a directory with {MANIFEST} nor a build id in "
            f"{settings.artifacts}",
            hint="run kzbuild build, or pass --artifact with a build id or an artifact directory",
        )
    assert recipe is not None, "a recipe or an artifact reference is needed"
    newest: tuple[float, Path] | None = None
    for manifest, doc in recorded_manifests(settings.artifacts):
        # a compile check (--target v79-check: "proves" compilation only) holds objects,
        # nothing to run
        if doc.get("recipe") == recipe.name and "proves" not in doc:
            stamp = manifest.stat().st_mtime
            if newest is None or stamp > newest[0]:
                newest = (stamp, manifest.parent)
    if newest is None:
        raise ConfigError(
            f"no artifact of recipe {recipe.name} in {settings.artifacts}",
            hint=f"run kzbuild build {recipe.name}, or pass --artifact BUILD_ID|PATH",
        )
    return load_artifact(newest[1])


def load_artifact(directory: Path) -> Artifact:
    """Read and check an artifact's manifest; every listed file must be there with its size."""
    directory = directory.resolve()
    path = directory / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the manifest: {exc.strerror}", path=path) from exc
    except ValueError as exc:
        raise ConfigError(f"the manifest is not valid JSON: {exc}", path=path) from exc
    if not isinstance(doc, dict):
        raise ConfigError("the manifest must be a JSON object", path=path)
    build_id = doc.get("build_id")
    if not isinstance(build_id, str) or not BUILD_ID_RE.match(build_id):
        raise ConfigError(f"{BUILD_ID_RULE}, not {build_id!r}", path=path, key="build_id")
    try:
        files = parse_files(doc.get("files"))
    except ValueError as exc:
        raise ConfigError(str(exc), path=path) from exc
    checked: set[str] = set()
    for entry in files:
        size = _regular_file(directory, entry.path, path, checked).st_size
        if size != entry.size:
            raise ConfigError(
                f"files: '{entry.path}' is {size} bytes on disk but {entry.size} in the manifest",
                path=path,
                hint="the artifact changed after it was built; rebuild it",
            )

    def text(key: str) -> str | None:
        value = doc.get(key)
        return value if isinstance(value, str) else None

    return Artifact(
        path=directory,
        build_id=build_id,
        files=files,
        recipe=text("recipe"),
        target=text("target"),
        build_commit=text("build_commit"),
        manifest=doc,
    )


def _regular_file(
    directory: Path, relpath: str, manifest: Path, checked: set[str]
) -> os.stat_result:
    """lstat of an artifact file that is a regular file inside ``directory``, reached without a
    symlink.

    A symlink (the file or a parent dir) could send a host file such as /etc/passwd to the device.
    ``relpath`` is normalized and free of ``..`` (parse_files checks), so a path whose every part
    is no symlink stays inside ``directory``; ``checked`` holds the dirs found so, to lstat each
    once. Paths are strings here: pathlib's objects cost more than the lstat calls for an artifact
    of thousands of files.
    """
    local = str(directory)
    parts = relpath.split("/")
    for index, part in enumerate(parts):
        local = f"{local}/{part}"
        last = index == len(parts) - 1
        if not last and local in checked:
            continue
        try:
            info = os.lstat(local)
        except OSError:
            raise ConfigError(
                f"files: '{relpath}' is listed but missing from {directory}", path=manifest
            ) from None
        if stat.S_ISLNK(info.st_mode):
            raise ConfigError(
                f"files: '{relpath}': {local} is a symlink; an artifact holds only regular files",
                path=manifest,
            )
        if not last:
            checked.add(local)
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(
            f"files: '{relpath}' is not a regular file inside {directory}", path=manifest
        )
    return info
