"""The patch stack: the series file and the patches it names, in apply order; lint findings.

What checking, exporting and bumping the stack find is in :mod:`kzbuild.model.stackcheck`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SeriesEntry:
    name: str  # file name as written in the series, relative to the series' folder
    path: Path  # absolute path of the patch file
    line: int  # line in the series file


@dataclass(frozen=True)
class Series:
    path: Path
    entries: tuple[SeriesEntry, ...]

    @property
    def directory(self) -> Path:
        return self.path.parent

    def names(self) -> list[str]:
        return [entry.name for entry in self.entries]

    def entry(self, name: str) -> SeriesEntry | None:
        return next((e for e in self.entries if e.name == name), None)


@dataclass(frozen=True)
class Problem:
    """One lint finding: a file, a line in it (when known) and what is wrong."""

    path: Path
    line: int | None
    message: str

    def where(self, root: Path | None = None) -> str:
        shown = self.path
        if root is not None and self.path.is_relative_to(root):
            shown = self.path.relative_to(root)
        return f"{shown}:{self.line}" if self.line else str(shown)
