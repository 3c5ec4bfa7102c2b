"""A results store survives what happens to files: a damaged database (each form), a bad or
truncated shard, a crash between the shard and the database, two writers at once."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kzbuild.errors import BadRecord, Busy, ConfigError
from kzbuild.measure import bench, resultsdb
from kzbuild.measure.resultsdb import ResultsStore
from tests.bench.benchkit import (
    CAPTURED_JSON,
    REPLAY_LLAMA_BENCH,
    SHARD,
    exported,
    flat,
    make_device_root,
    record,
)

STORED = [
    record(
        run_id=f"r{n}",
        host_time=f"2026-10-0{n + 1}T00:00:00+00:00",
        samples=(10.0 * (n + 1), 9.0, 11.0),
    )
    for n in range(3)
]


def unwrapped(text: str) -> str:
    return "".join(text.split())


@pytest.fixture
def folder(project) -> Path:
    path = project.root / "results"
    with ResultsStore(path) as store:
        store.add(STORED)
    return path


def listed_records(kz) -> list[tuple[str, list[float]]]:
    result = kz("results", "show", "r", "--json")
    assert result.code == 0, result.err
    assert "Traceback" not in result.err and "internal error" not in result.err
    return [(r["run_id"], r["samples_ts"]) for r in json.loads(result.out)]


EXPECTED = [(r.run_id, list(r.samples_ts)) for r in STORED]


# --- a damaged database is rebuilt from the shards ---
def drop_table(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE records")


def set_version(db: Path, version: int | None) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM schema_migrations")
        if version is not None:
            conn.execute("INSERT INTO schema_migrations VALUES (?, 'x', 'x')", (version,))


def change_a_number(db: Path) -> None:
    """Valid SQLite, wrong content: a sample edited in place."""
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE records SET record = replace(record, '[10.0,9.0,11.0]', '[99.0,9.0,11.0]')"
        )


def add_a_column(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE records ADD COLUMN extra TEXT")


DAMAGE = {  # form -> (how, whether the database must be rebuilt)
    "random bytes": (lambda db: db.write_bytes(os.urandom(8192)), True),
    "truncated": (lambda db: db.write_bytes(db.read_bytes()[: len(db.read_bytes()) // 2]), True),
    "header only": (lambda db: db.write_bytes(db.read_bytes()[:100]), True),
    "table missing": (drop_table, True),
    "newer schema version": (lambda db: set_version(db, 99), True),
    "no schema version": (lambda db: set_version(db, None), True),
    "other columns": (add_a_column, True),
    "a number changed in a row": (change_a_number, True),
    "zero length": (lambda db: db.write_bytes(b""), True),
    "a directory": (lambda db: (db.unlink(), db.mkdir()), True),
    # SQLite checks the headers of these and ignores them; the database stays as it was
    "garbage journal left behind": (
        lambda db: db.with_name(db.name + "-journal").write_bytes(os.urandom(4096)),
        False,
    ),
    "garbage wal left behind": (
        lambda db: db.with_name(db.name + "-wal").write_bytes(os.urandom(4096)),
        False,
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_each_form_of_a_damaged_database_is_rebuilt_from_the_export(kz, folder, damage):
    """Found by the first query that reads the damaged part: a changed row, when it is selected."""
    how, rebuilt = DAMAGE[damage]
    how(folder / resultsdb.DB_FILE)
    compared = kz("results", "compare", "r0", "r1", "--json")
    assert (
        compared.code == 0 and ("rebuilt it from the JSONL shards" in flat(compared.err)) == rebuilt
    )
    assert json.loads(compared.out)["rows"][0]["b"]["median"] == 11.0
    assert (folder / "results.sqlite3.damaged").exists() == rebuilt
    listed = kz("results", "list")
    assert listed.code == 0 and "rebuilt" not in listed.err  # once is enough
    assert listed_records(kz) == EXPECTED


def test_a_rebuild_says_why_and_keeps_the_damaged_file(kz, folder):
    (folder / resultsdb.DB_FILE).write_bytes(b"not a database" * 100)
    result = kz("results", "list")
    assert result.code == 0
    err = unwrapped(result.err)
    assert (
        "cannotbeused(fileisnotadatabase)" in err
        and "movedittoresults.sqlite3.damagedandrebuiltitfromtheJSONLshards" in err
    )
    assert (folder / "results.sqlite3.damaged").read_bytes() == b"not a database" * 100


def test_a_journal_from_a_crashed_writer_of_another_database_is_not_trusted(kz, folder, tmp_path):
    """A hot rollback journal holds pages of the database it came from; replayed into ours it
    damages it."""
    other = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(other, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("CREATE TABLE t (x TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 200)
    conn.execute("PRAGMA cache_size=1")  # spill: pages reach the file while the journal is hot
    conn.execute("BEGIN")
    conn.execute("UPDATE t SET x = 'y' || x")
    journal = other.with_name(other.name + "-journal").read_bytes()
    conn.execute("ROLLBACK")
    conn.close()
    (folder / (resultsdb.DB_FILE + "-journal")).write_bytes(journal)
    result = kz("results", "list")
    assert result.code == 0 and "database disk image is malformed" in flat(result.err)
    assert listed_records(kz) == EXPECTED


def test_a_database_locked_by_another_process_is_busy_not_damaged(folder):
    """Lock errors never look like damage: a rebuild would pull the database from under its
    writer."""
    with ResultsStore(folder) as store:
        holder = sqlite3.connect(folder / resultsdb.DB_FILE, timeout=0, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            store.conn.execute("PRAGMA busy_timeout=0")
            with pytest.raises(Busy, match="is locked by another process"):
                store.add([record(run_id="r9", host_time="2027-01-01T00:00:00+00:00")])
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    assert not (folder / "results.sqlite3.damaged").exists()


# --- the JSONL shards ---
def test_a_line_that_is_not_utf8_is_refused_naming_file_and_line(kz, folder):
    export = folder / SHARD
    lines = export.read_bytes().splitlines(keepends=True)
    export.write_bytes(lines[0] + lines[1].replace(b'"pad3"', b'"pad\xff"') + lines[2])
    result = kz("results", "list")
    assert result.code == 13
    assert unwrapped(f"{export}:2: not UTF-8 text") in unwrapped(
        result.err
    ) and "kzbuildresultschecklistseverybadline" in unwrapped(result.err)


def test_a_record_of_the_wrong_shape_is_refused_naming_key_and_value(kz, folder):
    export = folder / SHARD
    lines = export.read_text().splitlines()
    broken = json.loads(lines[2]) | {"samples_ts": [100.0, "fast"]}
    export.write_text("\n".join([*lines[:2], json.dumps(broken)]) + "\n")
    result = kz("results", "show", "latest")
    assert result.code == 13
    assert unwrapped(f"{export}:3: samples_ts[1]: 'fast' is not a number > 0") in unwrapped(
        result.err
    )


def test_a_truncated_last_line_is_skipped_and_the_next_record_starts_a_line_of_its_own(kz, folder):
    export = folder / SHARD
    whole = export.read_text()
    cut = whole[
        : whole.rindex("\n", 0, len(whole) - 1) + 1 + 40
    ]  # a writer killed 40 bytes into the last record
    export.write_text(cut)
    result = kz("results", "list", "--json")
    assert result.code == 0
    assert unwrapped(f"{export}:3: skipped the unterminated last line") in unwrapped(result.err)
    assert [run["run_id"] for run in json.loads(result.out)] == [
        "r0",
        "r1",
        "r2",
    ]  # the database still had r2
    with ResultsStore(folder) as store:  # to the same shard
        store.add([record(run_id="r9", host_time="2026-10-30T00:00:00+00:00")])
    assert [json.loads(line)["run_id"] for line in export.read_text().splitlines()] == [
        "r0",
        "r1",
        "r2",
        "r9",
    ]


def test_an_unterminated_but_whole_last_line_is_a_record(folder):
    export = folder / SHARD
    export.write_text(export.read_text().rstrip("\n"))  # an editor that drops the final newline
    with ResultsStore(folder) as store:  # to the same shard
        store.add([record(run_id="r9", host_time="2026-10-30T00:00:00+00:00")])
    assert [json.loads(line)["run_id"] for line in export.read_text().splitlines()] == [
        "r0",
        "r1",
        "r2",
        "r9",
    ]


def test_crlf_line_ends_are_read(folder):
    export = folder / SHARD
    export.write_bytes(export.read_bytes().replace(b"\n", b"\r\n"))
    (folder / resultsdb.DB_FILE).unlink()
    with ResultsStore(folder) as store:
        assert store.records() == STORED


def test_lines_that_arrive_while_a_bench_runs_are_kept(folder):
    """A git pull during a bench: the store was opened before it, the records are added after."""
    with ResultsStore(folder) as store:
        pulled = record(run_id="teammate", host_time="2026-09-01T00:00:00+00:00")
        with open(folder / SHARD, "a") as export:
            export.write(json.dumps(pulled.to_dict()) + "\n")
        store.add(
            [record(run_id="mine", host_time="2026-10-02T00:00:00+00:00")]
        )  # sorts early: appended all the same
    lines = (folder / SHARD).read_text().splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == ["r0", "r1", "r2", "teammate", "mine"]


def test_a_crash_after_the_export_is_written_loses_nothing(folder, monkeypatch):
    """The shard is written before the database commits: the next open reads the record back."""

    def crash(self: ResultsStore, path: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ResultsStore, "_stamp_file", crash)
    with ResultsStore(folder) as store, pytest.raises(KeyboardInterrupt):
        store.add([record(run_id="r9", host_time="2027-01-01T00:00:00+00:00")])
    monkeypatch.undo()
    with ResultsStore(folder) as store:
        assert [r.run_id for r in store.records()] == ["r0", "r1", "r2", "r9"]


def test_a_record_that_cannot_be_stored_is_refused_before_anything_is_written(folder):
    before = (folder / SHARD).read_bytes()
    nan_record = record(run_id="r9", host_time="2027-01-01T00:00:00+00:00", samples=(float("nan"),))
    with ResultsStore(folder) as store:
        with pytest.raises(
            BadRecord, match=r"record 'pp512' of run 'r9': avg_ts: nan is not a number > 0"
        ):
            store.add([record(run_id="ok", host_time="2027-01-02T00:00:00+00:00"), nan_record])
        not_utf8 = record(
            run_id="r9", env={"KZ": "\udcff"}
        )  # a non-UTF-8 argument decoded by Python
        with pytest.raises(BadRecord, match="cannot be stored"):
            store.add([not_utf8])
    assert (folder / SHARD).read_bytes() == before


def test_a_seed_figure_that_is_not_a_positive_number_or_has_nested_config_names_its_line(tmp_path):
    seed = tmp_path / "seed-bad.yaml"
    head = (
        "source: s\ndate: '2026'\ndevice: {name: pad3}\nfigures:\n  - id: x\n    model: m\n    "
        "test: pp\n"
    )
    for tail, message in (
        ("    value: .nan\n", r"seed-bad.yaml:8: value: must be a number > 0"),
        ("    value: 0\n", r"seed-bad.yaml:8: value: must be a number > 0"),
        (
            "    value: 1\n    config: {t: [1, 2]}\n",
            r"seed-bad.yaml:5: .*config.t: \[1, 2\] is not a string, number, bool or null",
        ),
    ):
        seed.write_text(head + tail)
        with pytest.raises(ConfigError, match=message):
            ResultsStore(tmp_path)


# --- llama-bench output beyond what the generated cases cover ---
def test_a_huge_list_of_tests_is_refused():
    test = json.loads(CAPTURED_JSON.read_text())[0]
    with pytest.raises(BadRecord, match=f"more than {bench.MAX_TESTS} is not llama-bench output"):
        bench.parse_llama_bench_json(json.dumps([test] * (bench.MAX_TESTS + 1)).encode())


def test_a_probe_reading_of_nan_or_inf_is_left_out():
    state = bench.parse_probe("thermal.cpu\tnan\nthermal.gpu\tinf\nthermal.ok\t41000\n")
    assert state.conditions["thermal_c"] == {"ok": 41.0}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nan%", "is not a finite percentage"),
        ("inf%", "is not a finite percentage"),
        ("-3%", "is negative"),
        ("abc", "is not a percentage"),
        ("", "must not be empty"),
    ],
)
def test_a_threshold_must_be_a_finite_percentage(kz, folder, value, message):
    result = kz("results", "compare", "r0", "r1", "--threshold", value)
    assert result.code == 2 and (
        message if not value else f"threshold '{value}' {message}"
    ) in flat(result.err)


# --- processes ---
def add_many(folder: str, writer: int, start: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    start.wait()
    for n in range(25):
        with ResultsStore(Path(folder)) as store:
            store.add(
                [
                    record(
                        run_id=f"w{writer}-{n}",
                        host_time=f"2027-01-01T00:00:{n:02d}+00:00",
                        seq=writer,
                    )
                ]
            )


def test_two_processes_storing_at_once_lose_and_interleave_nothing(tmp_path):
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    writers = [
        context.Process(target=add_many, args=(str(tmp_path), writer, start)) for writer in (1, 2)
    ]
    for process in writers:
        process.start()
    start.set()
    for process in writers:
        process.join(timeout=120)
        assert process.exitcode == 0
    lines = exported(tmp_path).splitlines()
    expected = {f"w{writer}-{n}" for writer in (1, 2) for n in range(25)}
    assert sorted(json.loads(line)["run_id"] for line in lines) == sorted(expected)
    (tmp_path / resultsdb.DB_FILE).unlink()  # and the export alone rebuilds all of them
    with ResultsStore(tmp_path) as store:
        assert {r.run_id for r in store.records()} == expected


def test_two_bench_commands_at_once_store_every_record(project, device_root, tmp_path):
    """Two devices (one bench holds each device's lock), one results store."""
    devices = [
        device_root,
        make_device_root(tmp_path / "device-2", manifest={"build_id": device_root.build_id}),
    ]
    for device in devices:
        device.add_tool("llama-bench", REPLAY_LLAMA_BENCH)
        device.add_file("models/tiny.gguf", b"GGUF stand-in")
    argv = [
        sys.executable,
        "-m",
        "kzbuild",
        "--project",
        str(project.root),
        "--work-dir",
        str(project.work),
        "--cache-dir",
        str(project.cache),
        "bench",
        "-m",
        "models/tiny.gguf",
        "--sweep",
        "t=1,2,3,4",
        "--json",
    ]
    benches = [
        subprocess.Popen(
            [*argv, "--device", device.spec],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for device in devices
    ]
    outputs = [process.communicate(timeout=300) for process in benches]
    for process, (_, err) in zip(benches, outputs, strict=True):
        assert process.returncode == 0, err
    run_ids = {json.loads(out)["run_id"] for out, _ in outputs}
    lines = exported(project.root / "results").splitlines()
    assert len(lines) == 16 and {json.loads(line)["run_id"] for line in lines} == run_ids
    with ResultsStore(project.root / "results") as store:
        assert len(store.records()) == 16


def test_run_piped_into_head_ends_without_a_traceback(device_root, project):
    """The reader goes away: the tool gets SIGPIPE as in a plain pipeline; nothing hangs."""
    device_root.add_tool("noisy", "#!/bin/sh\nwhile :; do echo hello; done\n")
    kzbuild = f"{sys.executable} -m kzbuild --project {project.root} --work-dir {project.work}"
    result = subprocess.run(
        ["sh", "-c", f"{kzbuild} run --device {device_root.spec} noisy | head -c 12"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout == "hello\nhello\n"
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


def test_paths_that_cannot_be_read_or_written_are_exit_2(kz, folder, project):
    missing = kz("results", "import-seed", str(project.root / "absent.jsonl"))
    assert missing.code == 2 and unwrapped(
        "absent.jsonl: cannot read file: No such file or directory"
    ) in unwrapped(missing.err)
    a_file = project.write("not-a-folder", "x")
    not_a_folder = kz("--results-dir", str(a_file), "results", "list")
    assert (
        not_a_folder.code == 2
        and unwrapped("--results-dir / KZ_RESULTS_DIR:") in unwrapped(not_a_folder.err)
        and unwrapped("is not a folder") in unwrapped(not_a_folder.err)
    )
    to_a_folder = kz("results", "plot", "--out", str(project.root))
    assert (
        to_a_folder.code == 2
        and unwrapped("cannot write the plot to") in unwrapped(to_a_folder.err)
        and unwrapped("Is a directory") in unwrapped(to_a_folder.err)
    )
    for result in (missing, not_a_folder, to_a_folder):
        assert "internal error" not in result.err


@pytest.mark.parametrize(
    "printed", ["", "\\n", "not-a-digest  models/tiny.gguf\\n", "\\xff\\xfe\\n"]
)
def test_a_sha256sum_that_prints_no_digest_is_a_device_error(kz, device_root, monkeypatch, printed):
    device_root.add_tool("llama-bench", REPLAY_LLAMA_BENCH)
    device_root.add_file("models/tiny.gguf", b"GGUF stand-in")
    fake = device_root.root / "fakebin"
    fake.mkdir()
    (fake / "sha256sum").write_text(f"#!/bin/sh\nprintf '{printed}'\n")
    (fake / "sha256sum").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    result = kz("bench", "--device", device_root.spec, "-m", "models/tiny.gguf")
    assert result.code == 8 and "printed no sha256" in flat(result.err)
