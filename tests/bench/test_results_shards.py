"""Monthly shards in git: the old single file is moved into them, two clones that append merge
(git's union driver, or `results merge` on a conflict), `results check` names every bad line."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from kzbuild.measure import resultfiles, resultsdb
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.model.result import Merged, canonical_json
from tests.bench.benchkit import SHARD, exported, record
from tests.conftest import REPO_ROOT


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 or args[0] == "merge", done.stderr
    return done.stdout + done.stderr


def run_ids(folder: Path) -> list[str]:
    with ResultsStore(folder) as store:
        return [r.run_id for r in store.records()]


def test_the_old_single_file_is_moved_into_monthly_shards(tmp_path, caplog):
    old = [record(run_id="r1"), record(run_id="r2", host_time="2026-11-03T00:00:00+00:00")]
    (tmp_path / resultfiles.LEGACY_FILE).write_text(
        "".join(canonical_json(r.to_dict()) + "\n" for r in old)
    )
    assert run_ids(tmp_path) == ["r1", "r2"]
    assert (
        not (tmp_path / resultfiles.LEGACY_FILE).exists()
        and "commit the results folder" in caplog.text
    )
    assert [p.name for p in resultfiles.shards(tmp_path)] == ["2026-10.jsonl", "2026-11.jsonl"]
    (tmp_path / resultsdb.DB_FILE).unlink()  # the shards alone rebuild it
    assert run_ids(tmp_path) == ["r1", "r2"]
    # a teammate on an older kzbuild appends to the old file: read and moved again
    (tmp_path / resultfiles.LEGACY_FILE).write_text(
        canonical_json(record(run_id="r3").to_dict()) + "\n"
    )
    assert run_ids(tmp_path) == ["r1", "r3", "r2"]  # r3 ran on 2026-10-01
    assert len(exported(tmp_path).splitlines()) == 3


def two_clones(tmp_path: Path) -> tuple[Path, Path]:
    origin, a, b = tmp_path / "origin.git", tmp_path / "a", tmp_path / "b"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    subprocess.run(["git", "clone", "-q", str(origin), str(a)], check=True, capture_output=True)
    (a / "results").mkdir()
    (a / "results" / ".gitignore").write_text(
        (REPO_ROOT / "results" / ".gitignore").read_text()
    )  # as the project's
    with ResultsStore(a / "results") as store:
        store.add([record(run_id="base")])
    git(a, "add", "results")
    git(a, "commit", "-qm", "base")
    git(a, "push", "-q", "origin", "HEAD:main")
    subprocess.run(["git", "clone", "-q", str(origin), str(b)], check=True, capture_output=True)
    return a, b


def append_and_commit(clone: Path, run_id: str) -> None:
    with ResultsStore(clone / "results") as store:
        store.add([record(run_id=run_id, host_time="2026-10-15T00:00:00+00:00")])
    git(clone, "add", "results")
    git(clone, "commit", "-qm", run_id)


def test_two_clones_that_append_to_one_shard_merge_without_a_conflict(tmp_path):
    a, b = two_clones(tmp_path)
    assert (b / "results" / ".gitattributes").read_text() == resultfiles.UNION_MERGE
    append_and_commit(a, "from-a")
    append_and_commit(b, "from-b")
    git(a, "push", "-q", "origin", "HEAD:main")
    merged = git(b, "pull", "--no-rebase", "-q", "origin", "main")
    assert "CONFLICT" not in merged
    assert run_ids(b / "results") == ["base", "from-a", "from-b"]
    assert git(b, "status", "--porcelain", "--untracked-files=no") == ""


def test_a_conflict_left_without_the_union_driver_is_resolved_by_results_merge(kz, tmp_path):
    a, b = two_clones(tmp_path)
    for clone in (a, b):
        (clone / "results" / ".gitattributes").write_text("")  # as a repo that dropped the driver
        git(clone, "commit", "-qam", "no union driver")
    append_and_commit(a, "from-a")
    append_and_commit(b, "from-b")
    git(b, "fetch", "-q", "origin")
    git(a, "push", "-q", "-f", "origin", "HEAD:main")
    git(b, "fetch", "-q", "origin")
    assert "CONFLICT" in git(b, "merge", "origin/main")
    assert (
        kz("--results-dir", str(b / "results"), "results", "list").code == 13
    )  # a marker line is no record
    merged = kz("--results-dir", str(b / "results"), "results", "merge")
    assert merged.code == 0, merged.err
    assert f"{SHARD}: 1 conflict(s) resolved" in merged.out
    assert run_ids(b / "results") == ["base", "from-a", "from-b"]
    git(b, "add", "results")
    git(b, "commit", "-qm", "merged")
    assert git(b, "status", "--porcelain", "--untracked-files=no") == ""


def test_check_lists_every_refused_line_and_why(kz, tmp_path):
    good = canonical_json(record().to_dict())
    bad_shape = json.dumps(record(run_id="r2").to_dict() | {"seq": -1})
    (tmp_path / SHARD).write_text("\n".join([good, "{not json", bad_shape, good]) + "\n")
    checked = kz("--results-dir", str(tmp_path), "results", "check")
    assert checked.code == 13
    assert f"refused {tmp_path / SHARD}:2: not valid JSON" in checked.out.replace("\n", "")
    assert f"refused {tmp_path / SHARD}:3: seq: -1" in checked.out.replace("\n", "")
    (tmp_path / SHARD).write_text(good + "\n")
    fine = kz("--results-dir", str(tmp_path), "results", "check")
    assert fine.code == 0 and "every line reads as a record; 1 runs stored" in fine.out


@given(st.one_of(st.text(max_size=12), st.from_regex(r"\A[0-9]{4}-[0-9]{2}[0-9T:+-]{0,10}\Z")))
def test_the_shard_of_a_host_time_is_the_same_in_python_and_in_sql(host_time):
    conn = sqlite3.connect(":memory:")
    resultsdb.migrate(conn, Path(":memory:"), resultsdb.MIGRATIONS[:2])
    conn.execute(
        "INSERT INTO records (record_id, run_id, kind, host_time, seq, device, test, record) "
        "VALUES ('i', 'r', 'bench', ?, 0, 'd', 't', '{}')",
        (host_time,),
    )
    resultsdb.migrate(conn, Path(":memory:"))
    assert conn.execute("SELECT shard FROM records").fetchone()[0] == resultfiles.shard_name(
        host_time
    )


@given(
    ours=st.lists(st.integers(0, 30), max_size=8),
    theirs=st.lists(st.integers(0, 30), max_size=8),
    base=st.integers(0, 3),
    conflicted=st.booleans(),
)
def test_merge_keeps_the_union_of_both_sides_once_in_time_order(
    tmp_path_factory, ours, theirs, base, conflicted
):
    folder = tmp_path_factory.mktemp("merge")
    line = {
        n: canonical_json(
            record(
                run_id=f"r{n:02d}", host_time=f"2026-10-{1 + n % 28:02d}T00:00:00+00:00"
            ).to_dict()
        )
        for n in range(31)
    }
    common = [line[n] for n in range(base)]
    if conflicted:
        body = [
            *common,
            "<<<<<<< HEAD",
            *(line[n] for n in ours),
            "=======",
            *(line[n] for n in theirs),
            ">>>>>>> other",
        ]
    else:  # what git's union driver leaves: both sides, repeats included
        body = [*common, *(line[n] for n in ours), *(line[n] for n in theirs)]
    (folder / SHARD).write_text("".join(text + "\n" for text in body))
    [merged] = resultfiles.merge_shards(folder)
    expected = sorted(
        {*common, *(line[n] for n in [*ours, *theirs])},
        key=lambda text: (json.loads(text)["host_time"], json.loads(text)["run_id"]),
    )
    assert (folder / SHARD).read_text() == "".join(text + "\n" for text in expected)
    assert merged.conflicts == int(conflicted)
    assert resultfiles.merge_shards(folder)[0] == Merged(
        folder / SHARD, 0, 0
    )  # a second merge changes nothing
