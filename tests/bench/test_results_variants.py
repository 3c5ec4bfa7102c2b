"""Records of interleaved experiments carry their variant; records from before keep their stored
form and id."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest

from kzbuild.errors import BadRecord
from kzbuild.measure import resultfiles, resultsdb
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.model.result import BenchRecord, VariantInfo, content_id
from tests.bench.benchkit import record

VARIANT = VariantInfo(name="minus:x.patch", block=2, blocks=5, seed=11, start_c=44.5, waited_s=30.0)


def test_a_record_without_a_variant_keeps_the_stored_form_and_id_it_had():
    plain = record()
    # the fields of schema 1's records
    newer = {"variant", "memory", "provenance"}
    old_keys = {f.name for f in dataclasses.fields(BenchRecord)} - newer
    assert set(json.loads(resultfiles.stored_form(plain))) == old_keys
    with_variant = dataclasses.replace(plain, variant=VARIANT)
    assert with_variant.record_id != plain.record_id
    stored = resultfiles.stored_form(with_variant)
    assert json.loads(stored)["variant"] == dataclasses.asdict(VARIANT)
    assert BenchRecord.from_dict(json.loads(stored)) == with_variant


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ({"name": "a", "block": 0, "blocks": 0, "seed": 1}, "blocks: 0 is not an integer from 1"),
        ({"name": 3, "block": 0, "blocks": 1, "seed": 1}, "name: 3 is not a string"),
        (
            {"name": "a", "block": 0, "blocks": 1, "seed": 1, "start_c": "hot"},
            "start_c: 'hot' is not a finite number",
        ),
        ({"name": "a", "block": 0, "blocks": 1, "seed": 1, "colour": 1}, "unknown key 'colour'"),
        ({"block": 0, "blocks": 1, "seed": 1}, "missing key 'name'"),
    ],
)
def test_a_bad_variant_is_refused_naming_the_key(variant, message):
    data = record().to_dict() | {"variant": variant}
    with pytest.raises(BadRecord, match=message):
        BenchRecord.from_dict(data)


def test_a_version_1_database_gains_the_variant_column_filled_from_its_rows(tmp_path):
    plain, tagged = (
        record(run_id="r1"),
        dataclasses.replace(record(run_id="r2", seq=0), variant=VARIANT),
    )
    conn = sqlite3.connect(tmp_path / resultsdb.DB_FILE, isolation_level=None)
    resultsdb.migrate(conn, tmp_path, resultsdb.MIGRATIONS[:1])
    for r in (plain, tagged):  # rows as a kzbuild of schema 1 wrote them
        stored = resultfiles.stored_form(r)
        conn.execute(
            "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                content_id(stored),
                r.run_id,
                r.kind,
                r.host_time,
                r.seq,
                r.build.build_id,
                r.device.name,
                r.test,
                stored,
            ),
        )
    conn.close()
    with ResultsStore(tmp_path) as store:
        assert store.schema_version() == resultsdb.MIGRATIONS[-1].version
        assert store.conn.execute(
            "SELECT run_id, variant FROM records ORDER BY run_id"
        ).fetchall() == [("r1", None), ("r2", "minus:x.patch")]
        assert store.records() == [plain, tagged]
        store.add(
            [dataclasses.replace(tagged, seq=1, variant=dataclasses.replace(VARIANT, name="full"))]
        )
        assert store.conn.execute("SELECT variant FROM records WHERE seq = 1").fetchone() == (
            "full",
        )
