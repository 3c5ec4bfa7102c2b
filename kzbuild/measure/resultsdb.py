"""The results database: SQLite under ``results/``, an index of the JSONL shards and seed files.

``results/results.sqlite3`` (git-ignored) has a versioned schema (``schema_migrations``). A
query selects in SQL, on indexes, and reads and checks only the rows it returns; a record is
checked once in full, when it enters the database. The files (see resultfiles) are the source
of truth: each is read back when it changed (a ``git pull`` brings teammates' results in), and
only its lines the database does not hold yet are parsed. Record ids are content hashes, so
importing anything twice stores it once.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from kzbuild.adapters.filelock import locked
from kzbuild.adapters.files import write_atomic
from kzbuild.errors import BadRecord, Busy, ConfigError, ResultsDatabaseDamaged, ResultsError
from kzbuild.measure import resultfiles
from kzbuild.measure.compare import unique
from kzbuild.measure.resultfiles import stored_form
from kzbuild.model.result import (
    MEASURED_KINDS,
    BenchRecord,
    Migration,
    RunSummary,
    StoredLine,
    content_id,
)

log = logging.getLogger(__name__)

DB_FILE = "results.sqlite3"
LATEST = "latest"  # selector: the newest measured run
MEASURED_SQL = "(" + ", ".join(f"'{kind}'" for kind in MEASURED_KINDS) + ")"  # kind IN this
RECORD_COLUMNS = (
    "record_id",
    "run_id",
    "kind",
    "host_time",
    "seq",
    "build_id",
    "device",
    "test",
    "record",
    "variant",
    "shard",
)
ORDER_COLUMNS = ("host_time", "run_id", "seq", "record_id")  # runs in time order, tests as printed
RECORD_ORDER = "ORDER BY " + ", ".join(ORDER_COLUMNS)
DAMAGED_SUFFIX = ".damaged"  # a damaged database is kept next to its rebuilt one, for a look
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")  # belong to the database file they sit next to
CHECKED_COLUMNS = (
    "run_id",
    "kind",
    "host_time",
    "seq",
    "build_id",
    "device",
    "test",
)  # each read is checked against the JSON
SELECT_ROWS = "SELECT record_id, record, " + ", ".join(CHECKED_COLUMNS) + " FROM records"
PREFIX_END = (
    "\U0010ffff"  # sorts after any text that starts with a prefix: prefix <= id < prefix + this
)
T = TypeVar("T")

# resultfiles.shard_name in SQL: the month of the host time, else undated
_SHARD_SQL = """CASE WHEN host_time GLOB '[0-9][0-9][0-9][0-9]-0[1-9]*'
    OR host_time GLOB '[0-9][0-9][0-9][0-9]-1[0-2]*'
    THEN substr(host_time, 1, 7) || '.jsonl' ELSE 'undated.jsonl' END"""

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
    Migration(
        3,
        "the monthly shard of each record, and an index in time order",
        f"""
        ALTER TABLE records ADD COLUMN shard TEXT NOT NULL DEFAULT '';
        UPDATE records SET shard = {_SHARD_SQL};
        CREATE INDEX records_shard ON records (shard, kind);
        CREATE INDEX records_time ON records (kind, host_time, run_id, seq, record_id);
        """,
    ),
)


def migrate(
    conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration] = MIGRATIONS
) -> list[int]:
    """Bring the schema up to the newest migration; returns the versions applied."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, description "
        "TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    current = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0]
    newest = migrations[-1].version
    if not isinstance(current, int) or current > newest:
        raise ResultsDatabaseDamaged(
            f"{path} has schema version {current!r}, not one this kzbuild knows (1 to {newest})"
        )
    applied = []
    for migration in migrations:
        if migration.version <= current:
            continue
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        conn.executescript(
            "BEGIN;\n"
            + migration.sql
            + f";\nINSERT INTO schema_migrations VALUES ({migration.version}, "
            f"{_sql_text(migration.description)}, {_sql_text(stamp)});\nCOMMIT;"
        )
        applied.append(migration.version)
    return applied


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


SCHEMA_QUERY = (
    "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY "
    "type, name"
)


@functools.cache
def expected_schema() -> tuple[tuple[object, ...], ...]:
    """sqlite_master as the migrations leave it: a database that differs was not made by this
    kzbuild."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn, Path(":memory:"))
        return tuple(conn.execute(SCHEMA_QUERY).fetchall())
    finally:
        conn.close()


class ResultsStore:
    """The database of one project's ``results/`` folder.

    The database is an index of the files: when it is unreadable, not this kzbuild's schema, or
    a row it returns does not match its content id, it is moved to ``results.sqlite3.damaged``
    and rebuilt from the shards and the seed files, with a warning.
    """

    conn: sqlite3.Connection

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"results folder {folder} cannot be made: {exc.strerror}",
                hint="--results-dir or KZ_RESULTS_DIR names it",
            ) from None
        self.db_path = folder / DB_FILE
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
        with locked(self.folder / resultfiles.LOCK_FILE, what=f"results database {self.db_path}"):
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1

    def _open(self) -> None:
        """Connect, bring the schema up to date, check it, and read in the files that changed."""
        self._disconnect()
        if (
            self.db_path.is_file() and not self.db_path.stat().st_size
        ):  # SQLite would take it for a new database
            raise ResultsDatabaseDamaged(f"{self.db_path} is empty (0 bytes)")
        self.conn = sqlite3.connect(self.db_path, isolation_level=None)
        # WAL: a commit is one append, no fsync of the main file; a crash loses at most the
        # last transaction, and the shard, written before each commit, brings it back
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        migrate(self.conn, self.db_path)
        if tuple(self.conn.execute(SCHEMA_QUERY).fetchall()) != expected_schema():
            raise ResultsDatabaseDamaged(
                f"{self.db_path}: its tables are not the ones schema version "
                f"{MIGRATIONS[-1].version} has"
            )
        self._import_changed()

    def _disconnect(self) -> None:
        if hasattr(self, "conn"):  # not set when the first connect failed
            self.conn.close()

    def _with_rebuild(self, action: Callable[[], T]) -> T:
        """Run ``action``; when it finds the database damaged, rebuild the database and run it once
        more."""
        try:
            return action()
        except (
            sqlite3.DatabaseError,
            ResultsDatabaseDamaged,
            UnicodeDecodeError,
        ) as exc:  # text that is not UTF-8
            reason = _damage(exc, self.db_path)
        with self._locked():
            damaged = self.db_path.with_name(self.db_path.name + DAMAGED_SUFFIX)
            log.warning(
                "results database %s cannot be used (%s); moved it to %s and rebuilt it from the "
                "JSONL shards",
                self.db_path,
                reason,
                damaged.name,
            )
            self._disconnect()
            if self.db_path.exists():
                os.replace(self.db_path, damaged)
            for suffix in SQLITE_SIDE_FILES:
                self.db_path.with_name(self.db_path.name + suffix).unlink(missing_ok=True)
            try:
                self._open()
                return action()
            except (sqlite3.DatabaseError, ResultsDatabaseDamaged, UnicodeDecodeError) as exc:
                raise ResultsError(
                    f"results database {self.db_path} cannot be used even rebuilt: "
                    f"{_damage(exc, self.db_path)}",
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
        """Store records (those already there are skipped) and append the new ones to their shards.

        Every record is checked to read back as itself before anything is written (else BadRecord);
        the shard is written (and synced) before the database commits, so a crash leaves the file
        complete or with a truncated last line, which the next open skips with a warning.
        """
        batch = list(records)  # read twice when a damaged database is rebuilt midway
        with self._locked():
            return self._with_rebuild(
                lambda: self._add([StoredLine(r, stored_form(r)) for r in batch])
            )

    def import_file(self, path: Path) -> int:
        """Import a seed YAML or a JSONL export; returns the number of new records."""
        return self.add(resultfiles.load_records_file(path))

    def _add(self, items: Sequence[StoredLine]) -> int:
        self._import_changed()  # another kzbuild or a git pull may have added lines: keep them
        with (
            self._transaction()
        ):  # a record that cannot be stored raises before the insert: nothing is written
            new = self._insert(items)
            by_shard: dict[str, list[str]] = defaultdict(list)
            for item in new:
                if item.record.kind in MEASURED_KINDS:
                    by_shard[resultfiles.shard_name(item.record.host_time)].append(
                        item.stored + "\n"
                    )
            for name, lines in sorted(by_shard.items()):
                path = self.folder / name
                if self._is_ours(path) and resultfiles.ends_with_newline(path):
                    resultfiles.append_line(
                        path, "".join(lines)
                    )  # the usual case: a bench that just ran
                else:  # new, or its last line unterminated (a killed writer): never glue onto it
                    self._export(name)
                self._stamp_file(path)
            if by_shard:
                resultfiles.mark_union_merge(self.folder)
        return len(new)

    def _insert(self, items: Iterable[StoredLine]) -> list[StoredLine]:
        """Insert (inside the caller's transaction); returns the records that were not there yet."""
        new = []
        insert = (
            f"INSERT OR IGNORE INTO records ({', '.join(RECORD_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(RECORD_COLUMNS))})"
        )
        for item in items:
            r = item.record
            row = (
                content_id(item.stored),
                r.run_id,
                r.kind,
                r.host_time,
                r.seq,
                r.build.build_id,
                r.device.name,
                r.test,
                item.stored,
                r.variant and r.variant.name,
                resultfiles.shard_name(r.host_time),
            )
            if self.conn.execute(insert, row).rowcount:
                new.append(item)
        return new

    def _import_changed(self) -> None:
        for path in resultfiles.sources(self.folder):
            self._import_if_changed(path)
        legacy = self.folder / resultfiles.LEGACY_FILE
        if legacy.is_file():
            self._move_legacy(legacy)

    def _import_if_changed(self, path: Path) -> None:
        stamp = _stamp(
            path
        )  # before reading: a change while reading shows as a new stamp next time
        row = self.conn.execute(
            "SELECT stamp FROM imported_files WHERE path = ?", (path.name,)
        ).fetchone()
        if row and row[0] == stamp:
            return
        if path.suffix == ".jsonl":
            items = resultfiles.read_new_records(path, self._known)
        else:
            items = [StoredLine(r, stored_form(r)) for r in resultfiles.load_seed(path)]
        with self._transaction():
            added = self._insert(items)
            self.conn.execute(
                "INSERT OR REPLACE INTO imported_files VALUES (?, ?)", (path.name, stamp)
            )
        if added:
            log.info("imported %d records from %s", len(added), path)

    def _known(self, record_id: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM records WHERE record_id = ?", (record_id,)).fetchone()
            is not None
        )

    def _move_legacy(self, legacy: Path) -> None:
        """The old layout's results.jsonl, imported, is written out as shards and removed."""
        with self._transaction():
            names = [
                row[0]
                for row in self.conn.execute(
                    f"SELECT DISTINCT shard FROM records WHERE kind IN {MEASURED_SQL}"
                )
            ]
            for name in names:
                self._export(name)
                self._stamp_file(self.folder / name)
            resultfiles.mark_union_merge(self.folder)
            legacy.unlink()
            self.conn.execute("DELETE FROM imported_files WHERE path = ?", (legacy.name,))
        log.warning(
            "moved %s into the monthly shards %s; commit the results folder",
            legacy,
            ", ".join(names) or "(none)",
        )

    def _is_ours(self, path: Path) -> bool:
        """The shard is as this database last wrote or read it."""
        row = self.conn.execute(
            "SELECT stamp FROM imported_files WHERE path = ?", (path.name,)
        ).fetchone()
        return path.is_file() and row is not None and row[0] == _stamp(path)

    def _export(self, shard: str) -> None:
        """Rewrite one shard from the database, in time order; replaced in one step."""
        rows = self.conn.execute(
            f"SELECT record FROM records WHERE shard = ? AND kind IN {MEASURED_SQL} {RECORD_ORDER}",
            (shard,),
        )
        write_atomic(self.folder / shard, "".join(row[0] + "\n" for row in rows).encode("utf-8"))

    def _stamp_file(self, path: Path) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO imported_files VALUES (?, ?)", (path.name, _stamp(path))
        )

    # --- reading ---
    def has_measurements(self) -> bool:
        return bool(
            self.conn.execute(
                f"SELECT EXISTS (SELECT 1 FROM records WHERE kind IN {MEASURED_SQL})"
            ).fetchone()[0]
            == 1
        )

    def records(self, selector: str | None = None) -> list[BenchRecord]:
        """Records in (host time, run, position) order; ``selector`` is a run id or build id
        (a prefix), or ``latest``.

        Selection happens in SQL; each row returned is checked against its content id and parsed,
        so a damaged row rebuilds the database rather than show a wrong number.
        """
        with gc_paused():
            return self._with_rebuild(lambda: self._select(selector))

    def _select(self, selector: str | None) -> list[BenchRecord]:
        if selector is None:
            return [
                self._parse(data)
                for data in self._checked(self.conn.execute(f"{SELECT_ROWS} {RECORD_ORDER}"))
            ]
        if selector == LATEST:
            newest = self.conn.execute(
                f"SELECT run_id FROM records WHERE kind IN {MEASURED_SQL} "
                "ORDER BY host_time DESC, run_id DESC LIMIT 1"
            ).fetchone()
            if newest is None:
                raise ResultsError("there are no measured results yet", hint="run kzbuild bench")
            rows = self.conn.execute(f"{SELECT_ROWS} WHERE run_id = ? {RECORD_ORDER}", (newest[0],))
        else:
            bounds = (selector, selector + PREFIX_END)
            rows = self.conn.execute(
                f"{SELECT_ROWS} WHERE (run_id >= ? AND run_id < ?) "
                f"OR (build_id >= ? AND build_id < ?) {RECORD_ORDER}",
                bounds + bounds,
            )
        chosen = [self._parse(data) for data in self._checked(rows)]
        if not chosen:
            raise ResultsError(
                f"no results match '{selector}'",
                hint="kzbuild results list shows run ids and build ids",
            )
        return chosen

    def stored(self, kind: str = "bench") -> list[dict[str, Any]]:
        """The stored JSON of every record of ``kind``, in time order, checked but not parsed into
        records: for views over the whole history (the report)."""
        query = f"{SELECT_ROWS} WHERE kind = ? {RECORD_ORDER}"
        with gc_paused():
            return self._with_rebuild(
                lambda: list(self._checked(self.conn.execute(query, (kind,))))
            )

    def _checked(self, rows: Iterable[tuple[Any, ...]]) -> Iterator[dict[str, Any]]:
        """Each row's stored JSON, checked against its content id and its indexed columns."""
        seen = set()
        for record_id, stored, *columns in rows:
            if (
                not isinstance(stored, str)
                or not isinstance(record_id, str)
                or content_id(stored) != record_id
            ):
                raise ResultsDatabaseDamaged(f"row {record_id!r} does not match its content")
            if record_id in seen:  # a damaged b-tree can list one row twice
                raise ResultsDatabaseDamaged(f"row {record_id!r} appears twice")
            seen.add(record_id)
            data = json.loads(stored)
            if not isinstance(data, dict) or _columns(data) != tuple(columns):
                raise ResultsDatabaseDamaged(
                    f"row {record_id!r}: its columns do not match its content"
                )
            data["record_id"] = record_id
            yield data

    def _parse(self, data: dict[str, Any]) -> BenchRecord:
        try:
            return BenchRecord.from_dict(data, where=f"{self.db_path} row {data['record_id']}")
        except BadRecord as exc:
            raise ResultsDatabaseDamaged(exc.message) from None

    def runs(self) -> list[RunSummary]:
        return self._with_rebuild(self._runs)

    def _runs(self) -> list[RunSummary]:
        """One summary per run; every row is checked, none parsed into a record."""
        by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for data in self._checked(self.conn.execute(f"{SELECT_ROWS} {RECORD_ORDER}")):
            by_run[data["run_id"]].append(data)
        summaries = []
        for run_id, rows in by_run.items():
            first = rows[0]
            summaries.append(
                RunSummary(
                    run_id=run_id,
                    kind=first["kind"],
                    host_time=first["host_time"],
                    device=first["device"]["name"],
                    build_ids=unique(row["build"]["build_id"] or "" for row in rows),
                    models=unique(row["model"]["name"] or row["model"]["path"] for row in rows),
                    tests=unique(row["test"] for row in rows),
                    records=len(rows),
                )
            )
        return sorted(summaries, key=lambda s: (s.host_time, s.run_id))

    def schema_version(self) -> int:
        return int(self.conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0])


def _columns(data: dict[str, Any]) -> tuple[object, ...]:
    """The indexed columns of a row as its stored JSON says (checked in full when stored)."""
    try:
        return (
            data["run_id"],
            data["kind"],
            data["host_time"],
            data["seq"],
            data["build"]["build_id"],
            data["device"]["name"],
            data["test"],
        )
    except (KeyError, TypeError):
        return ()


def _damage(exc: Exception, db_path: Path) -> str:
    """What is wrong with the database; a database merely locked by another process is Busy, not
    damage."""
    if (getattr(exc, "sqlite_errorname", "") or "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        raise Busy(
            f"results database {db_path} is locked by another process: {exc}",
            hint="wait for it to finish",
        ) from None
    return str(exc)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while many acyclic records are made or shown: its passes
    over every live object made reading or showing twice the records take more than twice the
    time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"
