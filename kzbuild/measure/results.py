"""The results store: SQLite under ``results/`` plus a JSONL export that diffs well in git.

``results/results.sqlite3`` (git-ignored) is the database, with a versioned schema
(``schema_migrations``). ``results/results.jsonl`` holds every measured record, one per line
with sorted keys, in (host time, run, position) order; new records are appended when they sort
last (a bench that just ran), else the file is rewritten. It is read back whenever it changed
(a ``git pull`` brings teammates' results in). ``results/seed-*.yaml`` hold historical figures
typed in by hand; they load as ``manual`` rows and are not exported.
Record ids are content hashes, so importing anything twice stores it once.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from kzbuild.adapters import yamlconf
from kzbuild.adapters.filelock import locked
from kzbuild.adapters.files import write_atomic
from kzbuild.adapters.settings import Settings
from kzbuild.errors import BadRecord, Busy, ConfigError, ResultsDatabaseDamaged, ResultsError
from kzbuild.model.bench import ENV_AXIS_PREFIX, OPTIONS_BY_NAME
from kzbuild.model.jsonfields import loads, number_or_none
from kzbuild.model.result import BenchRecord, BuildInfo, ComparedRow, Comparison, DeviceInfo, Group, Migration, ModelInfo, RunSummary, Summary, canonical_json, content_id

log = logging.getLogger(__name__)

DB_FILE = "results.sqlite3"
JSONL_FILE = "results.jsonl"
SEED_GLOB = "seed-*.yaml"
LATEST = "latest"  # selector: the newest measured run
RECORD_COLUMNS = ("record_id", "run_id", "kind", "host_time", "seq", "build_id", "device", "test", "record", "variant")
ORDER_COLUMNS = ("host_time", "run_id", "seq", "record_id")  # runs in time order, tests as printed
RECORD_ORDER = "ORDER BY " + ", ".join(ORDER_COLUMNS)
DAMAGED_SUFFIX = ".damaged"  # a damaged database is kept next to its rebuilt one, for a look
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")  # belong to the database file they sit next to
JSONL_HINT = "fix or delete that line (git diff shows what changed); results.jsonl is the source of truth"
T = TypeVar("T")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "records and the stamps of imported files",
        """
        CREATE TABLE records (
            record_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            host_time TEXT NOT NULL,
            seq INTEGER NOT NULL,
            build_id TEXT,
            device TEXT NOT NULL,
            test TEXT NOT NULL,
            record TEXT NOT NULL
        );
        CREATE INDEX records_run ON records (run_id);
        CREATE INDEX records_build ON records (build_id);
        CREATE TABLE imported_files (path TEXT PRIMARY KEY, stamp TEXT NOT NULL);
        """,
    ),
    Migration(
        2,
        "the variant of an interleaved experiment (kzbuild ab, kzbuild roll) a record measured",
        """
        ALTER TABLE records ADD COLUMN variant TEXT;
        UPDATE records SET variant = json_extract(record, '$.variant.name');
        CREATE INDEX records_variant ON records (run_id, variant);
        """,
    ),
)


def migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration] = MIGRATIONS) -> list[int]:
    """Bring the schema up to the newest migration; returns the versions applied."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    current = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0]
    newest = migrations[-1].version
    if not isinstance(current, int) or current > newest:
        raise ResultsDatabaseDamaged(f"{path} has schema version {current!r}, not one this kzbuild knows (1 to {newest})")
    applied = []
    for migration in migrations:
        if migration.version <= current:
            continue
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        conn.executescript(
            "BEGIN;\n"
            + migration.sql
            + f";\nINSERT INTO schema_migrations VALUES ({migration.version}, {_sql_text(migration.description)}, {_sql_text(stamp)});\nCOMMIT;"
        )
        applied.append(migration.version)
    return applied


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


SCHEMA_QUERY = "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"


@functools.cache
def expected_schema() -> tuple[tuple[object, ...], ...]:
    """sqlite_master as the migrations leave it: a database that differs was not made by this kzbuild."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn, Path(":memory:"))
        return tuple(conn.execute(SCHEMA_QUERY).fetchall())
    finally:
        conn.close()


class ResultsStore:
    """The database of one project's ``results/`` folder.

    The database is an index of the files: when it is unreadable, not this kzbuild's schema, or
    holds a row that does not match its content id, it is moved to ``results.sqlite3.damaged``
    and rebuilt from results.jsonl and the seed files, with a warning.
    """

    conn: sqlite3.Connection

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"results folder {folder} cannot be made: {exc.strerror}", hint="--results-dir or KZ_RESULTS_DIR names it") from None
        self.db_path = folder / DB_FILE
        self.jsonl_path = folder / JSONL_FILE
        self._lock_depth = 0
        with self._locked():
            self._with_rebuild(self._open)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The folder's lock; reentrant, since a read that finds damage rebuilds under it."""
        if self._lock_depth:
            yield
            return
        with locked(self.folder / ".results.lock", what=f"results database {self.db_path}"):
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1

    def _open(self) -> None:
        """Connect, bring the schema up to date, check it, and read in the files that changed."""
        self._disconnect()
        if self.db_path.is_file() and not self.db_path.stat().st_size:  # SQLite would take it for a new database
            raise ResultsDatabaseDamaged(f"{self.db_path} is empty (0 bytes)")
        self.conn = sqlite3.connect(self.db_path, isolation_level=None)
        # WAL: a commit is one append, no fsync of the main file; a crash loses at most the
        # last transaction, and results.jsonl, written before each commit, brings it back
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        migrate(self.conn, self.db_path)
        if tuple(self.conn.execute(SCHEMA_QUERY).fetchall()) != expected_schema():
            raise ResultsDatabaseDamaged(f"{self.db_path}: its tables are not the ones schema version {MIGRATIONS[-1].version} has")
        for source in [*sorted(self.folder.glob(SEED_GLOB)), self.jsonl_path]:
            self._import_if_changed(source)

    def _disconnect(self) -> None:
        if hasattr(self, "conn"):  # not set when the first connect failed
            self.conn.close()

    def _with_rebuild(self, action: Callable[[], T]) -> T:
        """Run ``action``; when it finds the database damaged, rebuild the database and run it once more."""
        try:
            return action()
        except (sqlite3.DatabaseError, ResultsDatabaseDamaged) as exc:
            reason = _damage(exc, self.db_path)
        with self._locked():
            damaged = self.db_path.with_name(self.db_path.name + DAMAGED_SUFFIX)
            log.warning("results database %s cannot be used (%s); moved it to %s and rebuilt it from %s", self.db_path, reason, damaged.name, JSONL_FILE)
            self._disconnect()
            if self.db_path.exists():
                os.replace(self.db_path, damaged)
            for suffix in SQLITE_SIDE_FILES:
                self.db_path.with_name(self.db_path.name + suffix).unlink(missing_ok=True)
            try:
                self._open()
                return action()
            except (sqlite3.DatabaseError, ResultsDatabaseDamaged) as exc:
                raise ResultsError(
                    f"results database {self.db_path} cannot be used even rebuilt: {_damage(exc, self.db_path)}",
                    hint="check the disk and the folder's permissions",
                ) from None

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.execute("COMMIT")

    # --- writing ---
    def add(self, records: Iterable[BenchRecord]) -> int:
        """Store records (those already there are skipped) and bring the JSONL export up to date.

        Every record is checked to read back as itself before anything is written (else BadRecord); results.jsonl
        is written (and synced) before the database commits, so a crash leaves the file complete
        or with a truncated last line, which the next open skips with a warning.
        """
        batch = list(records)  # read twice when a damaged database is rebuilt midway
        with self._locked():
            return self._with_rebuild(lambda: self._add(batch))

    def import_file(self, path: Path) -> int:
        """Import a seed YAML or a JSONL export; returns the number of new records."""
        batch = load_records_file(path)
        with self._locked():
            return self._with_rebuild(lambda: self._add(batch))

    def _add(self, records: Sequence[BenchRecord]) -> int:
        self._import_if_changed(self.jsonl_path)  # another kzbuild or a git pull may have added lines: a rewrite must keep them
        last = self.conn.execute(
            f"SELECT {', '.join(ORDER_COLUMNS)} FROM records WHERE kind = 'bench' "
            f"ORDER BY {', '.join(c + ' DESC' for c in ORDER_COLUMNS)} LIMIT 1"
        ).fetchone()
        with self._transaction():  # a record that cannot be stored raises in _insert: nothing is written, the insert rolls back
            new = self._insert(records)
            measured = sorted((item for item in new if item[0].kind == "bench"), key=lambda item: _order_key(item[0]))
            if measured:
                if last is not None and _order_key(measured[0][0]) > tuple(last) and self._export_is_ours() and ends_with_newline(self.jsonl_path):
                    # the usual case, a bench that just ran: its records sort after everything exported
                    append_line(self.jsonl_path, "".join(stored + "\n" for _, stored in measured))
                else:
                    # also when the last line is unterminated (a killed writer): never glue a record onto it
                    self._export()
                self._stamp_export()
        return len(new)

    def _insert(self, records: Iterable[BenchRecord]) -> list[tuple[BenchRecord, str]]:
        """Insert (inside the caller's transaction); returns the records that were not there yet, with their stored form."""
        new = []
        for r in records:
            stored = stored_form(r)
            row = (content_id(stored), r.run_id, r.kind, r.host_time, r.seq, r.build.build_id, r.device.name, r.test, stored, r.variant and r.variant.name)
            if self.conn.execute(f"INSERT OR IGNORE INTO records ({', '.join(RECORD_COLUMNS)}) VALUES ({', '.join('?' * len(RECORD_COLUMNS))})", row).rowcount:
                new.append((r, stored))
        return new

    def _import_if_changed(self, path: Path) -> None:
        if not path.is_file():
            return
        stamp = _stamp(path)  # before reading: a change while reading shows as a new stamp next time
        row = self.conn.execute("SELECT stamp FROM imported_files WHERE path = ?", (path.name,)).fetchone()
        if row and row[0] == stamp:
            return
        records = load_records_file(path)
        with self._transaction():
            added = self._insert(records)
            self.conn.execute("INSERT OR REPLACE INTO imported_files VALUES (?, ?)", (path.name, stamp))
        if added:
            log.info("imported %d records from %s", len(added), path)

    def _export_is_ours(self) -> bool:
        """results.jsonl is as this database last wrote or read it."""
        row = self.conn.execute("SELECT stamp FROM imported_files WHERE path = ?", (self.jsonl_path.name,)).fetchone()
        return self.jsonl_path.is_file() and row is not None and row[0] == _stamp(self.jsonl_path)

    def _export(self) -> None:
        """Rewrite results.jsonl: measured records, one per line, stable order; replaced in one step."""
        lines = [row[0] + "\n" for row in self.conn.execute(f"SELECT record FROM records WHERE kind = 'bench' {RECORD_ORDER}")]
        write_atomic(self.jsonl_path, "".join(lines).encode("utf-8"))

    def _stamp_export(self) -> None:
        self.conn.execute("INSERT OR REPLACE INTO imported_files VALUES (?, ?)", (self.jsonl_path.name, _stamp(self.jsonl_path)))

    # --- reading ---
    def has_measurements(self) -> bool:
        return bool(self.conn.execute("SELECT EXISTS (SELECT 1 FROM records WHERE kind = 'bench')").fetchone()[0] == 1)

    def records(self, selector: str | None = None) -> list[BenchRecord]:
        """Records in (host time, run, position) order; ``selector`` is a run id or build id (prefix), or ``latest``.

        Every row is checked against its content id and parsed, and selection happens on the
        parsed records, so a damaged row rebuilds the database rather than show a wrong number.
        """
        found = self._with_rebuild(self._all_records)
        if selector is None:
            return found
        if selector == LATEST:
            measured = [r for r in found if r.kind == "bench"]
            if not measured:
                raise ResultsError("there are no measured results yet", hint="run kzbuild bench")
            selector = max(measured, key=lambda r: r.host_time).run_id
        chosen = [r for r in found if r.run_id.startswith(selector) or (r.build.build_id or "").startswith(selector)]
        if not chosen:
            raise ResultsError(f"no results match '{selector}'", hint="kzbuild results list shows run ids and build ids")
        return chosen

    def _all_records(self) -> list[BenchRecord]:
        keyed = []
        seen = set()
        for record_id, stored in self.conn.execute("SELECT record_id, record FROM records"):
            if not isinstance(stored, str) or content_id(stored) != record_id:
                raise ResultsDatabaseDamaged(f"row {record_id!r} does not match its content")
            if record_id in seen:  # a damaged b-tree can list one row twice
                raise ResultsDatabaseDamaged(f"row {record_id!r} appears twice")
            seen.add(record_id)
            try:
                record = BenchRecord.from_dict(loads(stored, where=f"{self.db_path} row {record_id}"))
            except BadRecord as exc:
                raise ResultsDatabaseDamaged(exc.message) from None
            keyed.append(((record.host_time, record.run_id, record.seq, record_id), record))
        return [record for _, record in sorted(keyed, key=lambda item: item[0])]

    def runs(self) -> list[RunSummary]:
        by_run: dict[str, list[BenchRecord]] = defaultdict(list)
        for record in self.records():
            by_run[record.run_id].append(record)
        summaries = []
        for run_id, records in by_run.items():
            summaries.append(
                RunSummary(
                    run_id=run_id,
                    kind=records[0].kind,
                    host_time=records[0].host_time,
                    device=records[0].device.name,
                    build_ids=_unique(r.build.build_id or "" for r in records),
                    models=_unique(r.model.name or r.model.path for r in records),
                    tests=_unique(r.test for r in records),
                    records=len(records),
                )
            )
        return sorted(summaries, key=lambda s: (s.host_time, s.run_id))

    def schema_version(self) -> int:
        return int(self.conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0])


def stored_form(record: BenchRecord) -> str:
    """The record's line in results.jsonl (and its database row), checked to read back as the same
    record, so nothing is stored that results show, compare or plot cannot read."""
    return checked_line(record, BenchRecord.from_dict, f"record {record.test!r} of run {record.run_id!r}")


class Storable(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


StorableT = TypeVar("StorableT", bound=Storable)


def checked_line(record: StorableT, read: Callable[[object, str], StorableT], where: str) -> str:
    """``record``'s canonical JSON line, checked to be UTF-8 text that ``read`` (its type's from_dict)
    reads back as the same record; raises BadRecord naming ``where``."""
    data = record.to_dict()
    read(data, where)  # names the key of a value of the wrong type or range
    try:
        stored = canonical_json(data)
        stored.encode("utf-8")
    except (ValueError, TypeError) as exc:  # NaN, a value JSON has no form for, a lone surrogate (UnicodeEncodeError)
        raise BadRecord(f"{where} cannot be stored: {exc}") from None
    if read(loads(stored, where=where), where) != record:
        raise BadRecord(f"{where} does not read back as itself (a value of a type JSON does not keep)")
    return stored


def _damage(exc: Exception, db_path: Path) -> str:
    """What is wrong with the database; a database merely locked by another process is Busy, not damage."""
    if (getattr(exc, "sqlite_errorname", "") or "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        raise Busy(f"results database {db_path} is locked by another process: {exc}", hint="wait for it to finish") from None
    return str(exc)


def append_line(path: Path, text: str) -> None:
    """Append in one write with O_APPEND, then fsync: a crash leaves at most a truncated last line."""
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
    """``folder/name``: one checked record per line (quality records, device checks), appended under
    the folder's lock; ``read`` is the record type's from_dict."""

    def __init__(self, folder: Path, name: str, read: Callable[[object, str], StorableT], what: str) -> None:
        self.folder, self.name, self.read, self.what = folder, name, read, what
        self.path = folder / name

    def add(self, record: StorableT) -> None:
        append_to_jsonl(self.folder, self.name, checked_line(record, self.read, f"a {self.what}"), what=f"{self.what}s")

    def records(self) -> list[StorableT]:
        if not self.path.exists():
            return []
        return [self.read(data, where) for where, data in jsonl_objects(self.path)]


def ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        return size == 0 or os.pread(file.fileno(), 1, size - 1) == b"\n"


def _order_key(record: BenchRecord) -> tuple[object, ...]:
    return tuple(getattr(record, column) for column in ORDER_COLUMNS)


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _unique(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for v in values if v))


# --- files: JSONL exports and seed YAML ---
def load_records_file(path: Path) -> list[BenchRecord]:
    if path.suffix == ".jsonl":
        return load_jsonl(path)
    if path.suffix in (".yaml", ".yml"):
        return load_seed(path)
    raise ConfigError(f"cannot import {path}: expected a .jsonl export or a seed .yaml file", path=path)


def load_jsonl(path: Path) -> list[BenchRecord]:
    """Every record of a JSONL export (see jsonl_objects for what a bad line does)."""
    records = []
    for where, data in jsonl_objects(path, hint=JSONL_HINT):
        try:
            records.append(BenchRecord.from_dict(data, where=where))
        except BadRecord as exc:
            raise BadRecord(exc.message, hint=JSONL_HINT) from None
    return records


def jsonl_objects(path: Path, *, hint: str | None = None) -> list[tuple[str, Any]]:
    """Each line's JSON value with its ``file:line``. A bad line is refused (BadRecord naming
    file:line), except a last line that is not newline-terminated and not JSON: a writer killed
    mid-record left it, and it is skipped with a warning."""
    try:
        lines = path.read_bytes().split(b"\n")  # the last item is what follows the last newline
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", path=path) from None
    found = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            found.append((where, loads(line.decode("utf-8"), where=where)))
        except (UnicodeDecodeError, BadRecord) as exc:
            if number == len(lines):
                log.warning("%s: skipped the unterminated last line, not a whole record (a writer killed mid-line?)", where)
                continue
            message = f"{where}: not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
            raise BadRecord(message, hint=hint) from None
    return found


SEED_KEYS = ("source", "date", "device", "upstream", "figures")
SEED_DEVICE_KEYS = ("name", "soc", "notes")
FIGURE_KEYS = ("id", "label", "model", "engine", "backend", "test", "config", "value", "low", "high", "unit")


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


# --- comparing ---
def parse_threshold(text: str) -> float:
    """``5%`` or ``5`` -> 5.0 (percent): a finite number >= 0. The one parser of --threshold."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise ConfigError(f"threshold '{text}' is not a percentage", hint="use e.g. 5%") from None
    if not math.isfinite(value):  # float() reads nan and inf; against nan every change would pass as "same"
        raise ConfigError(f"threshold '{text}' is not a finite percentage", hint="use e.g. 5%")
    if value < 0:
        raise ConfigError(f"threshold '{text}' is negative", hint="use e.g. 5%")
    return value


def group(records: Iterable[BenchRecord]) -> list[Group]:
    by_key: dict[tuple[object, ...], list[BenchRecord]] = defaultdict(list)
    for record in records:
        by_key[record.group_key].append(record)
    return [Group(key, tuple(items)) for key, items in by_key.items()]


def compare(
    a: Sequence[BenchRecord],
    b: Sequence[BenchRecord],
    *,
    a_label: str,
    b_label: str,
    metric: str | None = None,
    threshold_pct: float = 5.0,
) -> Comparison:
    """Pair the groups of A and B that ran the same test on the same device, model and env.

    Throughput is better when higher: B regresses when its median is more than the threshold
    below A's. Raises ResultsError when nothing pairs, naming what differs.
    """
    if metric is not None:
        a, b = [r for r in a if r.test == metric], [r for r in b if r.test == metric]
        for label, selected in ((a_label, a), (b_label, b)):
            if not selected:
                raise ResultsError(f"{label} has no '{metric}' results")
    groups_a, groups_b = group(a), group(b)
    by_key_b = {g.key: g for g in groups_b}
    rows = []
    for group_a in groups_a:
        group_b = by_key_b.get(group_a.key)
        if group_b is not None:
            rows.append(_compare_pair(group_a, group_b, threshold_pct))
    if not rows:
        raise ResultsError(f"nothing in {a_label} is comparable with {b_label}: {explain_mismatch(a, b)}")
    rows.sort(key=lambda row: (row.a.first.device.name, row.a.first.test, describe_config(row.a.first), row.a.first.env_set))
    paired = {row.a.key for row in rows}
    return Comparison(
        a_label=a_label,
        b_label=b_label,
        metric=metric,
        threshold_pct=threshold_pct,
        rows=tuple(rows),
        only_a=tuple(g for g in groups_a if g.key not in paired),
        only_b=tuple(g for g in groups_b if g.key not in paired),
    )


def _compare_pair(a: Group, b: Group, threshold_pct: float) -> ComparedRow:
    median_a, median_b = a.summary.median, b.summary.median
    if not median_a or median_b is None:
        return ComparedRow(a, b, None, "n/a")
    change = (median_b - median_a) / median_a * 100.0
    verdict = "regression" if change < -threshold_pct else "improvement" if change > threshold_pct else "same"
    return ComparedRow(a, b, change, verdict)


def explain_mismatch(a: Sequence[BenchRecord], b: Sequence[BenchRecord]) -> str:
    """Name the first dimension on which A and B share nothing."""
    dimensions: tuple[tuple[str, Callable[[BenchRecord], Hashable], Callable[[BenchRecord], str]], ...] = (
        ("device", lambda r: r.device.key, describe_device),
        ("model", lambda r: r.model.key, lambda r: r.model.sha256 and r.model.sha256[:12] or r.model.name),
        ("env set", lambda r: r.env_set, lambda r: describe_env(r.env_set) or "no env"),
        ("test", lambda r: r.test, lambda r: r.test),
        ("configuration", lambda r: r.config_key, lambda r: describe_config(r)),
        ("unit", lambda r: r.unit, lambda r: r.unit),
    )
    for name, key, show in dimensions:
        keys_a, keys_b = {key(r): r for r in a}, {key(r): r for r in b}
        if not keys_a.keys() & keys_b.keys():
            shown_a = "; ".join(sorted({show(r) for r in keys_a.values()}))
            shown_b = "; ".join(sorted({show(r) for r in keys_b.values()}))
            return f"they share no {name} (A: {shown_a}; B: {shown_b}); results of different {name}s are never compared"
    return "no test ran with the same device, model, env set and configuration in both"


def describe_device(record: BenchRecord) -> str:
    fingerprint = record.device.fingerprint
    detail = fingerprint.get("android.fingerprint") or fingerprint.get("uname") or fingerprint.get("soc") or ""
    return f"{record.device.name} [{detail}]" if detail else record.device.name


def describe_env(env_set: Iterable[tuple[str, str]]) -> str:
    return " ".join(f"{k}={v}" for k, v in env_set)


SHORT_CONFIG = (("n_threads", "t"), ("n_gpu_layers", "ngl"), ("n_batch", "b"), ("n_ubatch", "ub"), ("devices", "dev"))


def describe_config(record: BenchRecord, skip: str = "") -> str:
    shown = [
        f"{short}={record.config[field]}"
        for field, short in SHORT_CONFIG
        if record.config.get(field) not in (None, "") and field != skip
    ]
    shown += [f"{k}={v}" for k, v in sorted(record.config.items()) if k in ("engine", "backend")]
    return " ".join(shown)


def varying_env(records: Iterable[BenchRecord]) -> set[str]:
    """Env names whose value differs between the given records (the rest is shared noise)."""
    values: dict[str, set[str]] = defaultdict(set)
    records = list(records)
    for record in records:
        env = dict(record.env_set)
        for name in {k for r in records for k in r.env}:
            values[name].add(env.get(name, "<unset>"))
    return {name for name, seen in values.items() if len(seen) > 1}


# --- plotting ---
PLOT_AXES = ("build", *(o.name for o in OPTIONS_BY_NAME.values() if o.field))


def axis_value(record: BenchRecord, axis: str) -> str | None:
    if axis in record.sweep.point:
        return record.sweep.point[axis]
    if axis.startswith(ENV_AXIS_PREFIX):
        return record.env.get(axis.removeprefix(ENV_AXIS_PREFIX))
    option = OPTIONS_BY_NAME.get(axis)
    if option is None or not option.field:
        raise ConfigError(f"cannot plot along '{axis}'", hint=f"axes: {', '.join(PLOT_AXES)}, env:NAME")
    value = record.raw.get(option.field, record.config.get(option.field))
    return None if value is None else str(value)


def plot(records: Sequence[BenchRecord], out: Path, *, axis: str = "build", metric: str | None = None) -> Path:
    """Write a PNG: prefill and decode medians (with min-max bars) along builds or one sweep axis.

    Manual reference rows are drawn as dashed lines. Series never mix devices, models or env.
    """
    measured = [r for r in records if r.kind == "bench" and (metric is None or r.test == metric)]
    references = [r for r in records if r.kind == "manual" and r.unit == "t/s" and (metric is None or _panel(r.test) == _panel(metric))]
    if not measured:
        raise ResultsError("nothing to plot: the selection has no measured results" + (f" for {metric}" if metric else ""))
    if axis != "build":
        axis_value(measured[0], axis)  # rejects an unknown axis before any drawing

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(2, 1, figsize=(9, 9), squeeze=False)
    panel_of = {"prefill": panels[0][0], "decode": panels[1][0]}
    builds = _unique(r.build.build_id or "?" for r in measured)
    for name, axes in panel_of.items():
        axes.set_title(f"{name} ({'over builds' if axis == 'build' else 'along ' + axis})")
        axes.set_ylabel("tokens/s (median, min-max)")
        axes.set_xlabel("build" if axis == "build" else axis)
        axes.grid(True, alpha=0.3)
    for label, points in _series(measured, axis, builds).items():
        xs = [x for x, _ in points]
        summaries = [s for _, s in points]
        medians = [s.median for s in summaries]
        errors = [
            [(s.median - s.low) if s.median is not None and s.low is not None else 0 for s in summaries],
            [(s.high - s.median) if s.median is not None and s.high is not None else 0 for s in summaries],
        ]
        axes = panel_of[_panel(label[0])]
        axes.errorbar(xs, medians, yerr=errors, marker="o", capsize=3, label=label[1])
    for record in references:
        axes = panel_of[_panel(record.test)]
        reference_label = f"{record.label or record.test}: {record.device.name} {record.model.name} (manual)"
        if record.avg_ts is not None:
            axes.axhline(record.avg_ts, linestyle="--", linewidth=1, color="gray", label=reference_label)
        elif record.range_ts:
            axes.axhspan(*record.range_ts, alpha=0.1, color="gray", label=reference_label)
    if axis == "build":
        for axes in panel_of.values():
            axes.set_xticks(range(len(builds)), [b[:12] for b in builds], rotation=30, ha="right", fontsize=8)
    for axes in panel_of.values():
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_png(figure, out, option="--out")


def save_png(figure: Any, out: Path, *, option: str) -> Path:
    """Write a matplotlib figure to ``out`` (named by ``option``) and free it."""
    import matplotlib.pyplot as plt

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out, format="png", dpi=100, bbox_inches="tight")
    except OSError as exc:
        raise ConfigError(f"cannot write the plot to {out}: {exc.strerror}", hint=f"{option} names a PNG file in a writable folder") from None
    finally:
        plt.close(figure)
    return out


def _panel(test: str) -> str:
    return "decode" if "tg" in test else "prefill"


def _series(
    records: Sequence[BenchRecord], axis: str, builds: Sequence[str]
) -> dict[tuple[str, str], list[tuple[float | int | str, Summary]]]:
    """(test, legend label) -> points (x, summary); one series per comparable group minus the axis."""
    grouped: dict[tuple[object, ...], list[BenchRecord]] = defaultdict(list)
    xs: dict[tuple[object, ...], dict[object, list[BenchRecord]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if axis == "build":
            x: object = builds.index(record.build.build_id or "?")
            key = record.group_key
        else:
            x = axis_value(record, axis)
            key = (record.build.build_id, *_without_axis(record, axis))
        grouped[key].append(record)
        xs[key][x].append(record)
    series = {}
    # one kind of x per plot: matplotlib cannot put numbers and text (auto, unset) on one axis
    numeric = all(_axis_number(x) is not None for by_x in xs.values() for x in by_x)
    shown_env = varying_env(records) - {axis.removeprefix(ENV_AXIS_PREFIX)}
    skip = OPTIONS_BY_NAME[axis].field if axis in OPTIONS_BY_NAME else ""
    for key, items in grouped.items():
        first = items[0]
        label = " ".join(
            part
            for part in (
                first.test if axis not in ("p", "n") else "",
                first.device.name,
                first.model.name or (first.model.sha256 or "")[:8],
                describe_config(first, skip=skip),
                describe_env((k, v) for k, v in first.env_set if k in shown_env),
                f"build {(first.build.build_id or '')[:12]}" if axis != "build" else "",
            )
            if part
        )
        points: list[tuple[float | int | str, Summary]] = []
        for x, rs in xs[key].items():
            number = _axis_number(x)
            points.append((number if numeric and number is not None else str(x), Group(key, tuple(rs)).summary))
        points.sort(key=lambda p: (isinstance(p[0], str), p[0] if not isinstance(p[0], str) else 0, str(p[0])))
        series[(first.test, label)] = points
    return series


def _without_axis(record: BenchRecord, axis: str) -> tuple[object, ...]:
    env_set, test, config_key = record.env_set, record.test, record.config_key
    if axis.startswith(ENV_AXIS_PREFIX):
        name = axis.removeprefix(ENV_AXIS_PREFIX)
        env_set = tuple(item for item in env_set if item[0] != name)
    elif axis in ("p", "n"):
        test = "pp" if "pp" in test else "tg"
    else:
        field = OPTIONS_BY_NAME[axis].field
        config_key = tuple(item for item in config_key if item[0] != field)
    return (record.device.key, record.model.key, env_set, test, config_key, record.unit)


def _axis_number(value: object) -> float | int | None:
    """The value as a finite number when its text is one (``4``, ``1e3``); None for ``auto``, ``nan``, None."""
    text = str(value)
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return number if math.isfinite(number) else None
    return None


# --- noise -----------------------------------------------------------------------------

NOISY_SPREAD_PCT = 5.0  # a spread above this hides differences of a few percent


def is_noisy(summary: Summary) -> bool:
    return summary.spread_pct is not None and summary.spread_pct > NOISY_SPREAD_PCT


# --- other results dirs ------------------------------------------------------------------

DEMO_RESULTS = "demo-results"  # scripts/demo keeps its results in WORK/demo-results


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
        try:
            with open(folder / JSONL_FILE, "rb") as jsonl:
                count = sum(1 for line in jsonl if line.strip())
        except OSError:
            continue
        if count:
            found.append((folder, count))
    return found


def elsewhere_hint(settings: Settings) -> str | None:
    """Where measured results are when the results dir in use has none: for an error's hint."""
    others = other_results_dirs(settings)
    if not others:
        return None
    listed = "; ".join(f"{folder} ({count} records)" for folder, count in others)
    return f"{settings.results} holds no measured results; they are in {listed}: pass --results-dir DIR or set KZ_RESULTS_DIR=DIR"
