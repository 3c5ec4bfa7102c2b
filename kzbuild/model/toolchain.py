"""Toolchains: what ``toolchains/*.yaml`` says about finding and verifying one, and what was found.

A spec is read from YAML by :mod:`kzbuild.build.toolchains`; detection turns it into a
:class:`Found` that names the file (or program) that proved the version, so a mismatch can
say exactly what was seen where.
"""

from __future__ import annotations

import fnmatch
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

VersionSource = Literal["file", "dirname", "command"]
DEFAULT_VERSION_REGEX = r"(\d+(?:\.\d+)+)"


def version_tuple(text: str) -> tuple[int, ...]:
    """``"3.22.2"`` -> ``(3, 22, 2)``; non-numeric parts end the tuple."""
    parts = []
    for piece in re.split(r"[.\-+]", text):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


@dataclass(frozen=True)
class VersionRule:
    """Where a version is read from and what it must be.

    ``file``: the first regex group in a file under the located folder (``source.properties``);
    ``dirname``: the folder's own name (``Hexagon_SDK/6.5.0.0``);
    ``command``: the program's output for ``args`` (``cmake --version``).
    """

    source: VersionSource
    regex: str = DEFAULT_VERSION_REGEX
    file: str = ""
    args: tuple[str, ...] = ("--version",)
    expect: str | None = None  # glob, e.g. "27.3.13750724" or "6.5.*"
    minimum: str | None = None

    def read(self, text: str) -> str | None:
        match = re.search(self.regex, text, re.MULTILINE)
        return match.group(1) if match else None

    def accepts(self, version: str) -> bool:
        if self.expect is not None and not fnmatch.fnmatchcase(version, self.expect):
            return False
        if self.minimum is not None and version_tuple(version) < version_tuple(self.minimum):
            return False
        return True

    @property
    def wanted(self) -> str:
        wants = []
        if self.expect is not None:
            wants.append(self.expect)
        if self.minimum is not None:
            wants.append(f">= {self.minimum}")
        return ", ".join(wants) or "any version"


@dataclass(frozen=True)
class DirectorySpec:
    """A toolchain that is a folder: where to look, in order, and what must be inside."""

    env: tuple[str, ...] = ()
    search: tuple[str, ...] = ()  # globs; ~ expands
    requires: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartSpec:
    """A folder inside the toolchain (the Hexagon tools), taken from ``env`` when set."""

    name: str
    label: str
    default: str  # relative to the toolchain root
    env: str | None = None
    requires: tuple[str, ...] = ()
    version: VersionRule | None = None


@dataclass(frozen=True)
class ProgramSpec:
    """An executable found on PATH; ``key`` names it in templates (``{cxx}``)."""

    key: str
    name: str
    version: VersionRule | None = None


@dataclass(frozen=True)
class ProbeSpec:
    """A command that must succeed for the toolchain to work (e.g. a reachable docker engine)."""

    what: str
    program: str  # a ProgramSpec key
    args: tuple[str, ...]


@dataclass(frozen=True)
class ImageSpec:
    """A container image; pinned by digest when one is given."""

    repository: str
    tag: str
    digest: str | None = None

    @property
    def ref(self) -> str:
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True)
class ToolchainSpec:
    name: str
    path: Path
    description: str
    label: str  # "NDK"
    release: str  # "r27d": what a recipe asks for, in the team's words
    provides: tuple[
        str, ...
    ]  # roles it fills; --toolchain swaps a target's toolchain of the same role
    directory: DirectorySpec | None = None
    version: VersionRule | None = None  # of the directory, or of the program named by command
    version_program: str | None = None  # key of the program whose output holds the version
    parts: tuple[PartSpec, ...] = ()
    programs: tuple[ProgramSpec, ...] = ()
    probes: tuple[ProbeSpec, ...] = ()
    image: ImageSpec | None = None
    cmake: tuple[tuple[str, str], ...] = ()  # templates: {root}, {<program key>}, {<part name>}
    env: tuple[tuple[str, str], ...] = ()
    runner: tuple[str, ...] = ()  # how to run what it builds on this machine (qemu)

    @property
    def title(self) -> str:
        return f"{self.label} {self.release}" if self.release else self.label

    @property
    def wanted(self) -> str:
        """``r27d (27.3.13750724)``: the release and the version that proves it."""
        if self.version is None:
            return self.release or "any version"
        rule = self.version.wanted
        if not self.release or rule == self.release:
            return rule
        return f"{self.release} ({rule})"

    def template_names(self) -> set[str]:
        names = {"root"} if self.directory else set()
        names |= {p.key for p in self.programs}
        names |= {p.name for p in self.parts}
        if self.image:
            names.add("image")
        return names


def template_fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


@dataclass(frozen=True)
class Found:
    """The outcome of looking for one toolchain."""

    spec: ToolchainSpec
    ok: bool
    version: str | None = None
    proof: str | None = None  # the file, folder or program that proved the version
    root: Path | None = None
    values: tuple[tuple[str, str], ...] = ()  # template values: root, program paths, parts
    problems: tuple[str, ...] = ()  # why it is not usable; the first is the headline
    notes: tuple[str, ...] = ()  # candidates passed over, and why
    versions: tuple[tuple[str, str], ...] = field(
        default=()
    )  # every version checked: label -> version
    banners: tuple[tuple[str, str], ...] = field(
        default=()
    )  # program -> its whole version line (distro builds differ)

    @property
    def name(self) -> str:
        return self.spec.name

    def render(self, template: str) -> str:
        """Fill ``{root}``-style fields; a toolchain that was not found leaves ``<name:field>``."""
        values = dict(self.values)
        return template.format_map(_Fill(values, self.spec.name))

    def cmake_options(self) -> list[tuple[str, str]]:
        return [(key, self.render(value)) for key, value in self.spec.cmake]

    def environment(self) -> list[tuple[str, str]]:
        return [(key, self.render(value)) for key, value in self.spec.env]

    def runner(self) -> list[str]:
        return [self.render(arg) for arg in self.spec.runner]

    def identity(self) -> dict[str, object]:
        """What enters a build id: names and versions, never paths (the same NDK anywhere is the
        same NDK)."""
        ident: dict[str, object] = {
            "name": self.spec.name,
            "version": self.version,
            "found": self.ok,
        }
        if self.versions:
            ident["versions"] = dict(self.versions)
        if self.banners:
            ident["banners"] = dict(self.banners)
        if self.spec.image:
            ident["image"] = self.spec.image.ref
        return ident

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.spec.name,
            "label": self.spec.label,
            "wanted": self.spec.wanted,
            "ok": self.ok,
            "version": self.version,
            "proof": self.proof,
            "root": str(self.root) if self.root else None,
            "versions": dict(self.versions),
            "banners": dict(self.banners),
            "problems": list(self.problems),
            "notes": list(self.notes),
            "file": str(self.spec.path),
        }


class _Fill(dict[str, str]):
    def __init__(self, values: dict[str, str], name: str) -> None:
        super().__init__(values)
        self.name = name

    def __missing__(self, key: str) -> str:
        return f"<{self.name}:{key}>"
