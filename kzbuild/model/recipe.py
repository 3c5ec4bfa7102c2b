"""A recipe: one buildable configuration (upstream pin, patch series, overlays, build, device)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

SourceKind = Literal["git", "pypi-sdist", "path"]
SOURCE_KINDS: tuple[SourceKind, ...] = ("git", "pypi-sdist", "path")


@dataclass(frozen=True)
class Source:
    """One place the pinned upstream commit can be fetched from."""

    kind: SourceKind
    location: str  # URL, "package==version" or a local path / file:// URL

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.location}"


@dataclass(frozen=True)
class Upstream:
    remote: str
    commit: str
    sources: tuple[Source, ...]


@dataclass(frozen=True)
class Overlay:
    """A file of the project's ``kernels/`` copied to ``dest`` inside the source tree."""

    src: Path  # absolute
    dest: str  # POSIX path relative to the tree root


@dataclass(frozen=True)
class BuildSection:
    """The recipe's build options; targets add their own (see kzbuild.build.builder)."""

    targets: tuple[str, ...] = ("host",)
    tools: tuple[str, ...] = ("llama-bench", "llama-completion", "test-backend-ops")
    cmake: tuple[tuple[str, str], ...] = ()

    @property
    def cmake_options(self) -> dict[str, str]:
        return dict(self.cmake)


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    description: str
    upstream: Upstream
    series: Path
    overlays: tuple[Overlay, ...] = ()
    build: BuildSection = field(default_factory=BuildSection)
    device: str | None = None

    @property
    def lock_path(self) -> Path:
        return self.path.with_suffix(".lock.json")

    @property
    def branch(self) -> str:
        return f"kz/{self.name}"
