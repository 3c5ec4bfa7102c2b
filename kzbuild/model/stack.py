"""The patch stack: the series file and the patches it names, in apply order."""

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
