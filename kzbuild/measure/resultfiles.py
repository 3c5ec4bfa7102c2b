"""The committed files of a results folder: monthly JSONL shards, the seed YAML, the old layout.

Measured records live in ``results/YYYY-MM.jsonl``, one per line, canonical JSON (sorted keys),
by the month their run started; a record whose time has no month goes to ``undated.jsonl``.
Lines are appended as runs arrive, so two machines that append to one shard merge with git's
built-in ``union`` driver (``results/.gitattributes``); ``kzbuild results merge`` resolves
a conflict left without it. ``results/results.jsonl``, the one file of the old layout, is read
and moved into shards. ``results/seed-*.yaml`` hold historical figures typed in by hand.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from kzbuild.adapters import yamlconf
from kzbuild.adapters.filelock import locked
from kzbuild.adapters.files import write_atomic
from kzbuild.adapters.settings import Settings
from kzbuild.errors import BadRecord, ConfigError
from kzbuild.model.jsonfields import loads, number_or_none
from kzbuild.model.result import (
    BenchRecord,
    BuildInfo,
    DeviceInfo,
    Merged,
    ModelInfo,
    Refused,
    StoredLine,
    canonical_json,
    content_id,
)

log = logging.getLogger(__name__)

LEGACY_FILE = "results.jsonl"  # the old layout: every record in one file
SEED_GLOB = "seed-*.yaml"
SHARD_GLOB = "[0-9][0-9][0-9][0-9]-[0-9][0-9].jsonl"
UNDATED_SHARD = "undated.jsonl"
GITATTRIBUTES = ".gitattributes"
LOCK_FILE = ".results.lock"
UNION_MERGE = (
    "# kzbuild: appended lines of two machines merge as their union\n*.jsonl merge=union\n"
)
JSONL_HINT = (
    "fix or delete that line (git diff shows what changed; kzbuild results check lists every bad "
    "line)"
)
CONFLICT_MARKERS = (b"<<<<<<< ", b"=======", b">>>>>>> ", b"||||||| ")
JSON_SPACE = " \t\r"  # what JSON allows around a value on one line
_MONTH = re.compile(r"([0-9]{4}-[0-9]{2})")


def shard_name(host_time: str) -> str:
    """The shard a record with this host time goes to: its month, else ``undated.jsonl``."""
    found = _MONTH.match(host_time)
    return (
        f"{found.group(1)}.jsonl" if found and "01" <= found.group(1)[5:] <= "12" else UNDATED_SHARD
    )


def shards(folder: Path) -> list[Path]:
    """The folder's shards, oldest month first."""
    return sorted([*folder.glob(SHARD_GLOB), *folder.glob(UNDATED_SHARD)])


def sources(folder: Path) -> list[Path]:
    """Every file the database is built from, seed files first."""
    legacy = [folder / LEGACY_FILE] if (folder / LEGACY_FILE).is_file() else []
    return [*sorted(folder.glob(SEED_GLOB)), *shards(folder), *legacy]


def mark_union_merge(folder: Path) -> None:
    """Tell git to merge the shards as the union of their lines (once; a user's file stays)."""
    path = folder / GITATTRIBUTES
    if not path.exists():
        write_atomic(path, UNION_MERGE.encode())


# --- reading ---
@dataclass(frozen=True)
class Line:
    where: str  # file:line
    text: str
    last_unterminated: bool  # a writer killed mid-record may have left it
    bad: str = ""  # why the line is not text (then text is empty)


def jsonl_lines(path: Path) -> Iterator[Line]:
    """Each non-blank line of a JSONL file; a line that is not UTF-8 text comes with ``bad`` set."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", path=path) from None
    # a UTF-8 byte order mark (an editor on Windows put it there) is not part of the first record
    lines = data.removeprefix(codecs.BOM_UTF8).split(b"\n")  # the last follows the last newline
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where, last = f"{path}:{number}", number == len(lines)
        try:
            yield Line(where, line.decode("utf-8"), last)
        except UnicodeDecodeError:
            yield Line(where, "", last, bad=f"{where}: not UTF-8 text")


def jsonl_objects(path: Path, *, hint: str | None = None) -> list[tuple[str, Any]]:
    """Each line's JSON value with its ``file:line``. A bad line is refused (BadRecord naming
    file:line), except a last line that is not newline-terminated and not JSON: a writer killed
    mid-record left it, and it is skipped with a warning."""
    found = []
    for line in jsonl_lines(path):
        parsed = _parse(line)
        if isinstance(parsed, BadRecord):
            raise BadRecord(parsed.message, hint=hint) from None
        if parsed is not None:
            found.append((line.where, parsed[0]))
    return found


def _parse(line: Line) -> tuple[Any] | BadRecord | None:
    """(a line's JSON value,), or why it has none; None for a truncated last line (skipped, with
    a warning)."""
    try:
        if line.bad:
            raise BadRecord(line.bad)
        return (loads(line.text, where=line.where),)
    except BadRecord as exc:
        if line.last_unterminated:
            log.warning(
                "%s: skipped the unterminated last line, not a whole record (a writer killed "
                "mid-line?)",
                line.where,
            )
            return None
        return exc


def read_new_records(path: Path, known: Callable[[str], bool]) -> list[StoredLine]:
    """The records of a JSONL file whose line is not ``known`` (by content id), checked; a bad line
    raises BadRecord naming file:line (a truncated last line is skipped with a warning)."""
    found = []
    for line in jsonl_lines(path):
        text = line.text.strip(JSON_SPACE)
        if text and known(content_id(text)):
            continue
        parsed = _parse(line)
        if isinstance(parsed, BadRecord):
            raise BadRecord(parsed.message, hint=JSONL_HINT)
        if parsed is None:
            continue
        try:
            record = BenchRecord.from_dict(parsed[0], where=line.where)
        except BadRecord as exc:
            raise BadRecord(exc.message, hint=JSONL_HINT) from None
        stored = canonical_json(record.to_dict())
        # a line in canonical form reads back as itself: it was just read; any other is checked
        found.append(StoredLine(record, stored if stored == text else stored_form(record)))
    return found


def load_records_file(path: Path) -> list[BenchRecord]:
    if path.suffix == ".jsonl":
        return [item.record for item in read_new_records(path, lambda _: False)]
    if path.suffix in (".yaml", ".yml"):
        return load_seed(path)
    raise ConfigError(
        f"cannot import {path}: expected a .jsonl export or a seed .yaml file", path=path
    )


def check_file(path: Path) -> list[Refused]:
    """Every line of a JSONL file that import refuses, with why (``results check``)."""
    refused = []
    for line in jsonl_lines(path):
        try:
            parsed = _parse(line)
            if isinstance(parsed, BadRecord):
                raise parsed
            if parsed is not None:
                stored_form(BenchRecord.from_dict(parsed[0], where=line.where))
        except BadRecord as exc:
            refused.append(Refused(line.where, exc.message.removeprefix(f"{line.where}: ")))
    return refused


# --- writing ---
class Storable(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


StorableT = TypeVar("StorableT", bound=Storable)


def stored_form(record: BenchRecord) -> str:
    """The record's line in its shard (and its database row), checked to read back as the same
    record, so nothing is stored that results show, compare or plot cannot read."""
    return checked_line(
        record, BenchRecord.from_dict, f"record {record.test!r} of run {record.run_id!r}"
    )


def checked_line(record: StorableT, read: Callable[[object, str], StorableT], where: str) -> str:
    """``record``'s canonical JSON line, checked to be UTF-8 text that ``read`` (its type's
    from_dict)
    reads back as the same record; raises BadRecord naming ``where``."""
    data = record.to_dict()
    read(data, where)  # names the key of a value of the wrong type or range
    try:
        stored = canonical_json(data)
        stored.encode("utf-8")
    except (
        ValueError,
        TypeError,
    ) as exc:  # NaN, a value JSON has no form for, a lone surrogate (UnicodeEncodeError)
        raise BadRecord(f"{where} cannot be stored: {exc}") from None
    if read(loads(stored, where=where), where) != record:
        raise BadRecord(
            f"{where} does not read back as itself (a value of a type JSON does not keep)"
        )
    return stored


def append_line(path: Path, text: str) -> None:
    """Append in one write with O_APPEND, then fsync: a crash leaves at most a truncated last
    line."""
    data = memoryview(text.encode("utf-8"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def append_to_jsonl(folder: Path, name: str, stored: str, *, what: str) -> None:
    """Append one checked line (:func:`checked_line`) to ``folder/name``, under the folder's lock
    ``.<stem>.lock``; never glued onto a line a killed writer left unterminated."""
    path = folder / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"results folder {folder} cannot be made: {exc.strerror}") from None
    with locked(folder / f".{path.stem}.lock", what=f"{what} {path}"):
        if path.is_file() and not ends_with_newline(path):
            append_line(path, "\n")
        append_line(path, stored + "\n")


class JsonlStore(Generic[StorableT]):
    """``folder/name``: one checked record per line (quality records, device checks), appended
    under the folder's lock; ``read`` is the record type's from_dict."""

    def __init__(
        self, folder: Path, name: str, read: Callable[[object, str], StorableT], what: str
    ) -> None:
        self.folder, self.name, self.read, self.what = folder, name, read, what
        self.path = folder / name

    def add(self, record: StorableT) -> None:
        stored = checked_line(record, self.read, f"a {self.what}")
        append_to_jsonl(self.folder, self.name, stored, what=f"{self.what}s")

    def records(self) -> list[StorableT]:
        if not self.path.exists():
            return []
        return [self.read(data, where) for where, data in jsonl_objects(self.path)]


def ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        return size == 0 or os.pread(file.fileno(), 1, size - 1) == b"\n"


# --- merging ---
def merge_shards(folder: Path) -> list[Merged]:
    """Resolve git's conflict markers in every shard as the union of both sides, drop repeated
    lines and sort each in time order; a shard is rewritten only when that changes it."""
    with locked(folder / LOCK_FILE, what=f"results folder {folder}"):
        return [_merge_shard(path) for path in shards(folder)]


def _merge_shard(path: Path) -> Merged:
    raw = path.read_bytes()
    kept: dict[str, None] = {}
    conflicts = lines = 0
    for line in raw.split(b"\n"):
        if line.startswith(CONFLICT_MARKERS):
            conflicts += line.startswith(CONFLICT_MARKERS[0])
            continue
        if line.strip():
            lines += 1
            kept.setdefault(line.decode("utf-8", errors="surrogateescape").strip(JSON_SPACE))
    text = "".join(line + "\n" for line in sorted(kept, key=_line_order)).encode(
        "utf-8", errors="surrogateescape"
    )
    if text != raw:
        write_atomic(path, text)
    return Merged(path, conflicts, lines - len(kept))


def _line_order(line: str) -> tuple[object, ...]:
    """A line's place in time order (host time, run, position); a line not a record sorts last."""
    try:
        data = json.loads(line)
        return (0, str(data["host_time"]), str(data["run_id"]), int(data["seq"]), line)
    except (ValueError, TypeError, KeyError):
        return (1, line)


# --- seed YAML ---
SEED_KEYS = ("source", "date", "device", "upstream", "figures")
SEED_DEVICE_KEYS = ("name", "soc", "notes")
FIGURE_KEYS = (
    "id",
    "label",
    "model",
    "engine",
    "backend",
    "test",
    "config",
    "value",
    "low",
    "high",
    "unit",
)


def load_seed(path: Path) -> list[BenchRecord]:
    """Historical figures typed in by hand, as ``manual`` records that name their source."""
    doc = yamlconf.load(path)
    doc.check_keys(SEED_KEYS, required=("source", "date", "device", "figures"), context="seed file")
    device = doc.get_mapping("device")
    device.check_keys(SEED_DEVICE_KEYS, required=("name",), context="seed device")
    fingerprint = {key: str(device[key]) for key in ("soc", "notes") if key in device}
    date = doc.get_str("date") or ""
    run_id = f"seed-{path.stem.removeprefix('seed-')}"
    figures = doc.get_list("figures")
    records: list[BenchRecord] = []
    for index, figure in enumerate(figures):
        if not isinstance(figure, yamlconf.Mapping):
            raise figures.error(index, "a figure is a mapping", key="figures")
        figure.check_keys(FIGURE_KEYS, required=("id", "model", "test"), context="figure")
        value, low, high = (_number(figure, key) for key in ("value", "low", "high"))
        if value is None and (low is None or high is None):
            raise figure.error(None, "a figure needs a value, or low and high")
        config = figure.get_mapping("config")
        extra = {key: figure.get_str(key) for key in ("engine", "backend") if key in figure}
        figure_record = BenchRecord(
            run_id=run_id,
            kind="manual",
            host_time=date,
            test=figure.get_str("test") or "",
            seq=index,
            build=BuildInfo(build_id=None, upstream=doc.get_str("upstream")),
            device=DeviceInfo(name=device.get_str("name") or "", fingerprint=fingerprint),
            model=ModelInfo(name=figure.get_str("model") or ""),
            config={**dict(config), **extra},
            avg_ts=value,
            range_ts=(low, high) if low is not None and high is not None else None,
            unit=figure.get_str("unit", "t/s") or "t/s",
            source=f"{path.name}#{figure.get_str('id')}: {doc.get_str('source')}",
            label=figure.get_str("label", "") or "",
        )
        try:
            stored_form(figure_record)
        except BadRecord as exc:  # a config value that is a list, a date, ...
            raise figure.error(None, exc.message) from None
        records.append(figure_record)
    return records


def _number(entry: yamlconf.Mapping, key: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if number_or_none(value) is None or value <= 0:
        raise entry.error(key, "must be a number > 0")
    return float(value)


# --- other results dirs ---
DEMO_RESULTS = "demo-results"  # scripts/demo keeps its results in WORK/demo-results


def count_lines(paths: Sequence[Path]) -> int:
    total = 0
    for path in paths:
        try:
            with open(path, "rb") as file:
                total += sum(1 for line in file if line.strip())
        except OSError:
            continue
    return total


def other_results_dirs(settings: Settings) -> list[tuple[Path, int]]:
    """The results dirs kzbuild knows of besides the one in use (the project's results/ and
    scripts/demo's), with how many measured records each holds; dirs with none are left out."""
    known = [settings.project / "results", settings.work / DEMO_RESULTS]
    seen = {settings.results.resolve()}
    found = []
    for folder in (path.resolve() for path in known):
        if folder in seen:
            continue
        seen.add(folder)
        count = measured_count(folder)
        if count:
            found.append((folder, count))
    return found


def measured_count(folder: Path) -> int:
    """How many measured records the results dir's JSONL shards hold (0 when none)."""
    return count_lines([*shards(folder), folder / LEGACY_FILE])


def reading_dir(settings: Settings) -> tuple[Path, str | None]:
    """The results dir to read, and a line saying where it is when it is not the one in use.

    With no dir chosen (--results-dir, KZ_RESULTS_DIR) and no measured results in the project's
    results/, the reading commands show what scripts/demo measured (WORK/demo-results).
    """
    demo = settings.work / DEMO_RESULTS
    chosen = settings.results_dir is not None
    if chosen or measured_count(settings.results) or not measured_count(demo):
        return settings.results, None
    return demo, f"results from {demo} (the demo's; {settings.results} holds no measured results)"


def elsewhere_hint(settings: Settings) -> str | None:
    """Where measured results are when the results dir in use has none: for an error's hint."""
    others = other_results_dirs(settings)
    if not others:
        return None
    listed = "; ".join(f"{folder} ({count} records)" for folder, count in others)
    return (
        f"{settings.results} holds no measured results; they are in {listed}: pass --results-dir "
        "DIR or set KZ_RESULTS_DIR=DIR"
    )
