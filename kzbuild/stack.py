"""The patch stack: reading and validating ``patches/series``.

The series lists one patch file per line in apply order; ``#`` starts a comment.
"""

from __future__ import annotations

from pathlib import Path

from kzbuild.errors import ConfigError
from kzbuild.model.stack import Series, SeriesEntry


def read_series(path: Path) -> Series:
    """Parse and validate a series file: every patch exists, none is listed twice."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise ConfigError("series file not found", path=path) from exc
    entries: list[SeriesEntry] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        if name in seen:
            raise ConfigError(f"'{name}' is listed twice (first on line {seen[name]})", path=path, line=number)
        patch = (path.parent / name).resolve()
        if not patch.is_relative_to(path.parent.resolve()):
            raise ConfigError(f"'{name}' lies outside the series folder", path=path, line=number)
        if not patch.is_file():
            raise ConfigError(f"patch file '{name}' does not exist", path=path, line=number)
        seen[name] = number
        entries.append(SeriesEntry(name=name, path=patch, line=number))
    return Series(path=path, entries=tuple(entries))
