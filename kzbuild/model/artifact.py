"""A build artifact: a directory with bin/, lib/ and manifest.json (written by ``kzbuild build``,
read by deploy).

The manifest's ``files`` map each relative POSIX path to its sha256, size and mode; its other
keys (inputs, toolchains, cmake command lines, times, ...) are kept in ``manifest``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
OCTAL_MODE = re.compile(r"0?o?[0-7]{3,4}")
# a build id becomes a directory name on the device and a field of deploys.log
BUILD_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
BUILD_ID_RULE = "must be 1-128 letters, digits and '._+-', starting with a letter or digit"


@dataclass(frozen=True)
class ArtifactFile:
    path: str  # POSIX path relative to the artifact dir, e.g. lib/libggml.so
    sha256: str
    size: int
    mode: int  # 0o755 or 0o644 (see safe_mode)


@dataclass(frozen=True)
class Artifact:
    path: Path  # the artifact folder
    build_id: str
    files: tuple[ArtifactFile, ...]
    recipe: str | None = None
    target: str | None = None
    build_commit: str | None = None  # what the binaries report (LLAMA_BUILD_COMMIT)
    manifest: Mapping[str, Any] = field(
        default_factory=dict, repr=False, compare=False
    )  # the whole manifest

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def local(self, relpath: str) -> Path:
        return self.path / relpath

    def file(self, relpath: str) -> ArtifactFile:
        for entry in self.files:
            if entry.path == relpath:
                return entry
        raise KeyError(relpath)

    @property
    def tools(self) -> list[str]:
        return [
            entry.path.removeprefix("bin/") for entry in self.files if entry.path.startswith("bin/")
        ]

    @property
    def libs(self) -> list[str]:
        return [
            entry.path.removeprefix("lib/") for entry in self.files if entry.path.startswith("lib/")
        ]

    @property
    def total_size(self) -> int:
        return sum(entry.size for entry in self.files)

    @property
    def files_digest(self) -> str:
        return files_digest(self.files)


def files_digest(files: tuple[ArtifactFile, ...]) -> str:
    """One digest over paths, contents and modes: two releases with the same digest are
    interchangeable."""
    lines = sorted(f"{entry.path}\0{entry.sha256}\0{entry.mode:o}\n" for entry in files)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def parse_files(files: object) -> tuple[ArtifactFile, ...]:
    """The ``files`` section of a manifest: ``{relpath: {sha256, size, mode}}``. Raises
    ValueError."""
    if not isinstance(files, Mapping) or not files:
        raise ValueError("'files' must be a non-empty mapping of relative paths")
    parsed = []
    for relpath, entry in files.items():
        # a plain relative path: no empty part (absolute, "a//b", "a/"), no "." and no ".."; the
        # string's own split, not PurePosixPath (which costs more than the rest for thousands)
        parts = relpath.split("/") if isinstance(relpath, str) else [""]
        if "" in parts or "." in parts or ".." in parts:
            raise ValueError(f"files: '{relpath}' is not a plain relative path")
        if CONTROL_CHARS.search(relpath):  # device tools print one path per line
            raise ValueError(f"files: {relpath!r} holds a control character")
        if parts[0] == MANIFEST:
            raise ValueError(
                f"files: '{relpath}': '{MANIFEST}' is the release's own manifest; it cannot be one "
                "of its files"
            )
        if not isinstance(entry, Mapping):
            raise ValueError(f"files: '{relpath}' must map to {{sha256, size, mode}}")
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not SHA256_RE.match(sha):
            raise ValueError(f"files: '{relpath}': sha256 must be 64 lowercase hex digits")
        size = entry.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"files: '{relpath}': size must be a non-negative integer")
        parsed.append(
            ArtifactFile(
                relpath, sha, size, safe_mode(parse_mode(relpath, entry.get("mode", 0o644)))
            )
        )
    return tuple(parsed)


def safe_mode(mode: int) -> int:
    """Only plain modes reach a device: no setuid, setgid, sticky or group/world write."""
    return 0o755 if mode & 0o111 else 0o644


def parse_mode(relpath: str, mode: object) -> int:
    """A mode as an integer (0o755 = 493) or an octal string ("0755", "755")."""
    if isinstance(mode, int) and not isinstance(mode, bool):
        value = mode
    elif isinstance(mode, str) and OCTAL_MODE.fullmatch(mode):
        value = int(mode.lstrip("0o") or "0", 8)
    else:
        raise ValueError(
            f"files: '{relpath}': mode must be an integer or an octal string like \"0755\""
        )
    if not 0 <= value <= 0o7777:
        raise ValueError(f"files: '{relpath}': mode {value:o} is out of range")
    return value
