"""The patch stack's series file: read it, validate it, and edit it keeping its comments.

The series lists one patch file per line in apply order; ``#`` starts a comment. The patch
files themselves are read by ``kzbuild.source.stack.patchfile``. This module stays small: recipes
and
sync import it on every kzbuild start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kzbuild.adapters.files import write_atomic
from kzbuild.adapters.yamlconf import read_text
from kzbuild.errors import ConfigError
from kzbuild.model.stack import Problem, Series, SeriesEntry


def parse_series(path: Path) -> tuple[Series, list[Problem]]:
    """The series and everything wrong with it; entries with problems are left out."""
    if not path.exists():
        raise ConfigError("series file not found", path=path)
    lines = read_text(path).splitlines()
    entries: list[SeriesEntry] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    folder = path.parent.resolve()
    for number, raw in enumerate(lines, start=1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        try:
            patch = (path.parent / name).resolve()
            exists = patch.is_file()
        except (
            OSError,
            ValueError,
        ) as exc:  # a NUL byte, a name longer than the file system allows
            problems.append(Problem(path, number, f"{name!r} is not a usable file name: {exc}"))
            continue
        if name in seen:
            problems.append(
                Problem(path, number, f"'{name}' is listed twice (first on line {seen[name]})")
            )
        elif not patch.is_relative_to(folder):
            problems.append(Problem(path, number, f"'{name}' lies outside the series folder"))
        elif not exists:
            problems.append(Problem(path, number, f"patch file '{name}' does not exist"))
        else:
            seen[name] = number
            entries.append(SeriesEntry(name=name, path=patch, line=number))
    return Series(path=path, entries=tuple(entries)), problems


def read_series(path: Path) -> Series:
    """Parse and validate a series file: every patch exists, none is listed twice."""
    series, problems = parse_series(path)
    if problems:
        first = problems[0]
        raise ConfigError(first.message, path=first.path, line=first.line)
    return series


def series_files(folder: Path) -> list[Path]:
    """The series files of a patches folder: ``series`` and any ``*.series`` (recipes may name their
    own)."""
    return sorted(
        p for p in folder.iterdir() if p.is_file() and (p.name == "series" or p.suffix == ".series")
    )


def unlisted_patches(folder: Path) -> list[Path]:
    """Patch files in ``folder`` that no series file there names."""
    listed = {
        entry.path for path in series_files(folder) for entry in parse_series(path)[0].entries
    }
    return sorted(p.resolve() for p in folder.rglob("*.patch") if p.resolve() not in listed)


@dataclass
class _Block:
    """A series entry with the comment lines written directly above it, or free text."""

    lines: list[str]
    name: str | None = None


def _blocks(text: str) -> list[_Block]:
    """Split a series into entries (with the comment lines directly above them) and free text.

    The comment lines the file starts with, up to the first blank line or entry, are its
    header and never move.
    """
    blocks: list[_Block] = []
    pending: list[str] = []
    in_header = True
    for raw in text.splitlines(keepends=True):
        name = raw.split("#", 1)[0].strip()
        if name:
            blocks.append(_Block(pending + [raw if raw.endswith("\n") else raw + "\n"], name))
            pending, in_header = [], False
        elif raw.strip() and not in_header:  # a comment belongs to the entry below it
            pending.append(raw)
        else:
            blocks.extend(_Block([line]) for line in pending)
            pending = []
            blocks.append(_Block([raw]))
            in_header = in_header and bool(raw.strip())
    blocks.extend(_Block([line]) for line in pending)
    return blocks


def reorder_series(path: Path, names: list[str]) -> bool:
    """Make the series list exactly ``names`` in that order, keeping its comments.

    An entry keeps the comments written above it; new names go after the last entry.
    Returns whether the file changed.
    """
    text = read_text(path)
    blocks = _blocks(text)
    by_name = {b.name: b for b in blocks if b.name}
    slots = [i for i, b in enumerate(blocks) if b.name]
    wanted = [by_name.get(name) or _Block([f"{name}\n"], name) for name in names]
    result: list[_Block] = []
    for index, block in enumerate(blocks):
        if block.name is None:
            result.append(block)
            continue
        position = slots.index(index)
        if position < len(wanted):
            result.append(wanted[position])
        if index == slots[-1]:
            result.extend(wanted[len(slots) :])
    if not slots:
        result.extend(wanted)
    new_text = "".join(line for block in result for line in block.lines)
    if new_text == text:
        return False
    write_atomic(path, new_text.encode("utf-8"))
    return True
