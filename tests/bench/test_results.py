"""The results store and its commands: schema versions, JSONL export, seed rows, compare, plot."""

from __future__ import annotations

import json
import sqlite3
import struct
import zlib
from pathlib import Path

import pytest

from kzbuild.errors import ConfigError, ResultsError
from kzbuild.measure import resultfiles, resultplot, resultsdb
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.model.result import BenchRecord, Migration
from tests.bench.benchkit import SHARD, flat, record

REPO_SEED = Path(__file__).resolve().parents[2] / "results" / "seed-2026-05.yaml"


# --- schema ---
def test_a_new_database_records_its_schema_version(tmp_path):
    with ResultsStore(tmp_path) as store:
        assert store.schema_version() == resultsdb.MIGRATIONS[-1].version
        rows = store.conn.execute("SELECT version, description FROM schema_migrations").fetchall()
    assert rows == [(m.version, m.description) for m in resultsdb.MIGRATIONS]
    with ResultsStore(tmp_path) as store:  # reopening applies nothing again
        assert store.conn.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0] == len(
            resultsdb.MIGRATIONS
        )


def test_an_older_database_is_migrated_and_keeps_its_rows(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.add([record()])
    later = Migration(
        resultsdb.MIGRATIONS[-1].version + 1,
        "index by test",
        "CREATE INDEX records_test ON records (test)",
    )
    conn = sqlite3.connect(tmp_path / resultsdb.DB_FILE, isolation_level=None)
    assert resultsdb.migrate(conn, tmp_path, [*resultsdb.MIGRATIONS, later]) == [later.version]
    assert conn.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 1
    assert conn.execute(
        "SELECT name FROM sqlite_master WHERE name = 'records_test'"
    ).fetchone() == ("records_test",)
    conn.close()


def test_a_database_from_a_newer_kzbuild_is_rebuilt_from_the_export(tmp_path, caplog):
    with ResultsStore(tmp_path) as store:
        store.add([record()])
    conn = sqlite3.connect(tmp_path / resultsdb.DB_FILE)
    conn.execute("INSERT INTO schema_migrations VALUES (99, 'future', 'x')")
    conn.commit()
    conn.close()
    with ResultsStore(tmp_path) as store:
        assert store.schema_version() == resultsdb.MIGRATIONS[-1].version
        assert store.records() == [record()]
    assert (
        "has schema version 99, not one this kzbuild knows" in caplog.text
        and "rebuilt it from the JSONL shards" in caplog.text
    )


# --- JSONL export ---
def test_shards_take_records_by_month_in_arrival_order_and_merge_sorts_them(tmp_path):
    batch = [
        record(run_id="r2", host_time="2026-10-02T00:00:00+00:00", test="tg128", seq=1),
        record(run_id="r2", host_time="2026-10-02T00:00:00+00:00", test="pp512", seq=0),
        record(run_id="r1", host_time="2026-10-01T00:00:00+00:00"),
        record(run_id="r3", host_time="2026-11-05T00:00:00+00:00"),
        record(run_id="r0", host_time="recently"),
    ]
    with ResultsStore(tmp_path / "a") as first:  # in time order
        for item in sorted(batch, key=lambda r: (r.host_time, r.seq)):
            first.add([item])
    with ResultsStore(
        tmp_path / "b"
    ) as second:  # older records arrive later: appended all the same
        for item in batch:
            second.add([item])
        assert second.add(batch) == 0  # already there: nothing changes
    assert sorted(path.name for path in resultfiles.shards(tmp_path / "b")) == [
        "2026-10.jsonl",
        "2026-11.jsonl",
        "undated.jsonl",
    ]
    arrived = (tmp_path / "b" / SHARD).read_text().splitlines()
    assert [json.loads(line)["run_id"] for line in arrived] == ["r2", "r2", "r1"]
    assert (tmp_path / "b" / ".gitattributes").read_text().endswith("*.jsonl merge=union\n")
    for folder in ("a", "b"):
        resultfiles.merge_shards(tmp_path / folder)
    text = (tmp_path / "a" / SHARD).read_text()
    assert text == (tmp_path / "b" / SHARD).read_text()
    lines = text.splitlines()
    assert [(json.loads(line)["run_id"], json.loads(line)["test"]) for line in lines] == [
        ("r1", "pp512"),
        ("r2", "pp512"),
        ("r2", "tg128"),
    ]
    for line in lines:
        assert line == json.dumps(
            json.loads(line), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )


def test_the_database_is_rebuilt_from_the_export_and_follows_its_changes(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.add([record(run_id="r1")])
    (tmp_path / resultsdb.DB_FILE).unlink()
    with ResultsStore(tmp_path) as store:
        assert [r.run_id for r in store.records()] == ["r1"]
    # a teammate's result arrives through git: the export changed, the database follows
    extra = record(run_id="r9", host_time="2026-11-01T00:00:00+00:00")
    with open(tmp_path / SHARD, "a") as export:
        export.write(json.dumps(extra.to_dict(), sort_keys=True) + "\n")
    with ResultsStore(tmp_path) as store:
        assert [r.run_id for r in store.records()] == ["r1", "r9"]


def test_a_damaged_export_names_its_line(tmp_path):
    (tmp_path / SHARD).write_text(json.dumps(record().to_dict()) + "\n{not json\n")
    with pytest.raises(ResultsError, match=r"2026-10.jsonl:2: not valid JSON"):
        ResultsStore(tmp_path)


def test_records_round_trip_through_their_dict():
    original = record(env={"GGML_HEXAGON_GDN_SELECT": "2"})
    assert BenchRecord.from_dict(json.loads(json.dumps(original.to_dict()))) == original


# --- seed figures ---
def test_the_seed_figures_load_as_manual_rows_with_their_source(tmp_path):
    (tmp_path / REPO_SEED.name).write_text(REPO_SEED.read_text())
    with ResultsStore(tmp_path) as store:
        seed = store.records("seed-2026-05")
        assert (
            store.import_file(tmp_path / REPO_SEED.name) == 0
        )  # already imported when the db was made
    assert {r.kind for r in seed} == {"manual"}
    assert all(r.source.startswith("seed-2026-05.yaml#") and "May 2026" in r.source for r in seed)
    by_id = {r.source.split("#")[1].split(":")[0]: r for r in seed}
    assert by_id["cpu-decode"].avg_ts == 16.5 and by_id["cpu-decode"].test == "tg"
    assert (
        by_id["htp-prefill-best"].avg_ts == 49.9
        and by_id["htp-prefill-best"].config["n_gpu_layers"] == 99
    )
    assert (
        by_id["htp-prefill-range"].range_ts == (44.0, 58.0)
        and by_id["htp-prefill-range"].avg_ts is None
    )
    assert (
        by_id["qwen3-htp-prefill"].avg_ts == 159
        and by_id["qwen3-htp-prefill"].model.name == "Qwen3-4B"
    )
    assert by_id["executorch-ttft"].unit == "ms"
    assert {r.device.name for r in seed} == {"pad3"}
    assert not (tmp_path / SHARD).exists()  # manual rows live in their yaml, not the export


def test_a_bad_seed_figure_names_file_line_and_key(tmp_path):
    seed = tmp_path / "seed-bad.yaml"
    seed.write_text(
        "source: s\ndate: '2026'\ndevice: {name: pad3}\nfigures:\n  - id: x\n    model: m\n    "
        "test: pp\n    value: fast\n"
    )
    with pytest.raises(ConfigError, match=r"seed-bad.yaml:8: value: must be a number > 0"):
        ResultsStore(tmp_path)
    seed.write_text(
        "source: s\ndate: '2026'\ndevice: {name: pad3}\nfigures:\n  - id: x\n    model: m\n    "
        "test: pp\n"
    )
    with pytest.raises(
        ConfigError, match=r"seed-bad.yaml:5: a figure needs a value, or low and high"
    ):
        ResultsStore(tmp_path)


def test_import_seed_command_imports_the_project_seed_files(kz, project):
    project.write(f"results/{REPO_SEED.name}", REPO_SEED.read_text())
    result = kz("results", "import-seed")
    assert result.code == 0, result.err
    assert "seed-2026-05.yaml: 0 new records" in flat(
        result.out
    )  # the database made at open imported them
    listed = kz("results", "list", "--json")
    assert [(run["run_id"], run["kind"], run["records"]) for run in json.loads(listed.out)] == [
        ("seed-2026-05", "manual", 8)
    ]


# --- compare ---
def store_with(project, *records: BenchRecord) -> None:
    with ResultsStore(project.root / "results") as store:
        store.add(records)


def test_compare_finds_a_regression_past_the_threshold_and_exits_9(kz, project):
    store_with(
        project,
        record(run_id="r1", build_id="build-a", samples=(100.0, 101.0, 99.0)),
        record(run_id="r1", build_id="build-a", test="tg128", samples=(20.0, 20.5, 19.5), seq=1),
        record(
            run_id="r2",
            build_id="build-b",
            samples=(90.0, 91.0, 89.0),
            host_time="2026-10-02T00:00:00+00:00",
        ),
        record(
            run_id="r2",
            build_id="build-b",
            test="tg128",
            samples=(20.2, 20.1, 19.9),
            host_time="2026-10-02T00:00:00+00:00",
            seq=1,
        ),
    )
    result = kz("results", "compare", "build-a", "build-b", "--threshold", "5%", "--json")
    assert result.code == 9
    rows = {row["test"]: row for row in json.loads(result.out)["rows"]}
    assert rows["pp512"]["verdict"] == "regression" and rows["pp512"][
        "change_pct"
    ] == pytest.approx(-10.0)
    assert rows["pp512"]["a"]["median"] == 100.0 and rows["pp512"]["b"]["median"] == 90.0
    assert rows["tg128"]["verdict"] == "same"
    assert "1 test(s) of build-b regressed past 5% against build-a (worst -10.0%)" in flat(
        result.err
    )
    # a looser threshold lets the same numbers pass; --metric keeps one test
    assert kz("results", "compare", "build-a", "build-b", "--threshold", "15").code == 0
    only_tg = kz("results", "compare", "build-a", "build-b", "--metric", "tg128", "--json")
    assert only_tg.code == 0 and [row["test"] for row in json.loads(only_tg.out)["rows"]] == [
        "tg128"
    ]


def test_compare_markdown_table(kz, project):
    store_with(
        project,
        record(run_id="r1", build_id="build-a"),
        record(run_id="r2", build_id="build-b", samples=(120.0, 121.0, 119.0)),
    )
    result = kz("results", "compare", "r1", "r2", "--markdown")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    speed = "| test | device | config | env | A median | A spread | B median | B spread |"
    memory = " A peak MiB | B peak MiB | memory | memory verdict |"
    assert speed + " change | verdict |" + memory in lines
    assert any(
        line.startswith("| pp512 | pad3 | t=8 ngl=99 b=512 |") and "+20.0% | improvement |" in line
        for line in lines
    )


@pytest.mark.parametrize(
    ("b_changes", "message"),
    [
        (
            {"device": "pad4", "fingerprint": "vendor/pad4:15/AP3A"},
            "they share no device (A: pad3 [vendor/pad3:15/AP3A]; B: pad4 [vendor/pad4:15/AP3A])",
        ),
        ({"fingerprint": "vendor/pad3:16/BP1A"}, "they share no device"),
        ({"model_sha": "b" * 64}, "they share no model (A: aaaaaaaaaaaa; B: bbbbbbbbbbbb)"),
        ({"env": {"GGML_HEXAGON_GDN_SELECT": "1"}}, "they share no env set"),
        (
            {"config": {"n_threads": 6, "n_gpu_layers": 99, "n_batch": 512}},
            "they share no configuration (A: t=8 ngl=99 b=512; B: t=6 ngl=99 b=512)",
        ),
    ],
)
def test_compare_never_mixes_devices_models_or_env(kz, project, b_changes, message):
    store_with(
        project,
        record(run_id="r1", build_id="build-a"),
        record(run_id="r2", build_id="build-b", samples=(10.0,), **b_changes),
    )
    result = kz("results", "compare", "r1", "r2")
    assert result.code == 13
    assert "nothing in r1 is comparable with r2" in flat(result.err)
    assert message in flat(result.err)


def test_compare_groups_what_can_be_paired_and_lists_the_rest(kz, project):
    gdn2 = {"GGML_HEXAGON_GDN_SELECT": "2"}
    store_with(
        project,
        record(run_id="r1", build_id="build-a"),
        record(run_id="r1", build_id="build-a", env=gdn2, seq=1),
        record(run_id="r2", build_id="build-b", samples=(50.0, 50.0, 50.0)),
    )
    result = kz("results", "compare", "r1", "r2", "--json")
    assert result.code == 9
    data = json.loads(result.out)
    assert [row["env"] for row in data["rows"]] == [{"LD_LIBRARY_PATH": "{release}/lib"}]
    assert len(data["only_a"]) == 1


def test_env_of_different_builds_still_pairs_through_the_release_dir():
    a, b = record(build_id="build-a"), record(build_id="build-b")
    assert a.env != b.env and a.env_set == b.env_set


def test_compare_refuses_unknown_selectors_and_metrics(kz, project):
    store_with(project, record(run_id="r1"))
    missing = kz("results", "compare", "r1", "nope")
    assert missing.code == 13 and "no results match 'nope'" in flat(missing.err)
    no_metric = kz("results", "compare", "r1", "r1", "--metric", "tg999")
    assert no_metric.code == 13 and "r1 has no 'tg999' results" in flat(no_metric.err)
    bad = kz("results", "compare", "r1", "r1", "--threshold", "five")
    assert bad.code == 2 and "threshold 'five' is not a percentage" in flat(bad.err)


def test_show_and_latest(kz, project):
    store_with(
        project,
        record(run_id="r1"),
        record(run_id="r2", host_time="2026-10-05T00:00:00+00:00", samples=(1.0, 2.0, 4.0)),
    )
    result = kz("results", "show", "latest", "--markdown")
    assert result.code == 0, result.err
    row = next(line for line in result.out.splitlines() if line.startswith("| pp512"))
    # median 2, spread (4-1)/2, flagged as noisy; no memory measured
    assert "| 2.00 | t/s | 150.0% (n=3) ! | - | - |  |" in row
    assert json.loads(kz("results", "show", "latest", "--json").out)[0]["run_id"] == "r2"


def test_latest_without_measurements_says_so(kz, project):
    result = kz("results", "show", "latest")
    assert result.code == 13 and "there are no measured results yet" in flat(result.err)


# --- plot ---
def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a valid PNG (signature and IHDR checksum verified)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    assert struct.unpack(">I", data[29:33])[0] == zlib.crc32(data[12:29])
    assert data.endswith(b"IEND\xaeB`\x82")
    return struct.unpack(">II", data[16:24])


def test_plot_over_builds_and_along_a_sweep_axis_writes_pngs(kz, project):
    store_with(
        project,
        *[
            record(
                run_id="r1",
                build_id="build-a",
                config={"n_threads": t, "n_gpu_layers": 99, "n_batch": 512},
                seq=t,
            )
            for t in (4, 6, 8)
        ],
        record(
            run_id="r2", build_id="build-b", host_time="2026-10-03T00:00:00+00:00", test="tg128"
        ),
    )
    over_builds = project.root / "over-builds.png"
    result = kz("results", "plot", "--out", str(over_builds))
    assert result.code == 0, result.err
    assert png_size(over_builds)[0] > 300
    along = project.root / "along-t.png"
    assert kz("results", "plot", "r1", "--axis", "t", "--out", str(along)).code == 0
    assert png_size(along)[1] > 300


def test_the_plot_shows_each_sample_names_the_model_and_no_text_overlaps(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(resultplot, "save_png", lambda figure, out, option: drawn.append(figure))
    build = "host-0123456789abcdef"
    runs = [
        record(run_id="r1", build_id=build, samples=(7000.0, 52000.0, 54000.0)),
        record(run_id="r1", build_id=build, test="tg16", seq=1, samples=(2800.0, 11400.0, 13500.0)),
    ]
    resultplot.plot(runs, tmp_path / "plot.png")
    (figure,) = drawn
    figure.canvas.draw()
    drawn_samples = ([7000.0, 52000.0, 54000.0], [2800.0, 11400.0, 13500.0])
    for axes, samples in zip(figure.axes, drawn_samples, strict=True):
        (dots,) = axes.collections
        assert sorted(y for _, y in dots.get_offsets()) == samples  # every sample, not a bar
        (label,) = [text.get_text() for text in axes.get_legend().get_texts()]
        assert " q.gguf " in label  # the model by its file name, not a hash
    renderer = figure.canvas.get_renderer()
    texts = [
        text
        for axes in figure.axes
        for text in (axes.title, axes.xaxis.label, axes.yaxis.label, *axes.get_xticklabels())
    ]
    boxes = [text.get_window_extent(renderer) for text in texts if text.get_text()]
    overlapping = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]
    assert not overlapping


def test_plot_refuses_an_unknown_axis_and_an_empty_selection(kz, project):
    store_with(project, record(run_id="r1"))
    bad_axis = kz("results", "plot", "--axis", "colour", "--out", str(project.root / "x.png"))
    assert bad_axis.code == 2 and "cannot plot along 'colour'" in flat(bad_axis.err)
    no_metric = kz("results", "plot", "--metric", "tg9", "--out", str(project.root / "x.png"))
    assert no_metric.code == 13 and "nothing to plot" in flat(no_metric.err)
    assert not (project.root / "x.png").exists()


def test_in_a_pipe_results_list_keeps_each_run_on_one_line(kz, project):
    """Output to a log or a pipe is never wrapped to 80 columns: a run's cells stay on its line."""
    builds = [f"host-{n}abcdef0123456789" for n in range(4)]
    tests = ("pp512", "tg128", "pp2048", "tg512")
    run = "2026-10-01T10-00-00-long-run-name"
    pairs = enumerate(zip(builds, tests, strict=True))
    records = [record(run_id=run, build_id=b, test=t, seq=i) for i, (b, t) in pairs]
    store_with(project, *records)
    listed = kz("results", "list")
    assert listed.code == 0, listed.err
    (row,) = [line for line in listed.out.splitlines() if "long-run-name" in line]
    assert "2026-10-01T10-00-00-long-run-name" in row and "pad3" in row
    assert ", ".join(b[:12] for b in builds) in row and "pp512 tg128 pp2048 tg512" in row
    assert row.rstrip().endswith(" 4")  # the records count
    assert len(row) > 80
