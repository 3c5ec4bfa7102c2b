"""Generated bad inputs (hypothesis): llama-bench output, results.jsonl lines, database bytes.

130 cases per run (40 + 20 + 40 + 30), about 25 s on a loaded 2-core machine. Each case runs the CLI
in-process and asserts an exit code from README's list (0 for valid
data, 13 for bad results), no traceback or internal error, that nothing wrong was stored, and
that ``results list`` and ``show`` still answer with the right records afterwards.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.measure import resultfiles, resultsdb
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.model.result import BenchRecord, canonical_json
from tests.bench.benchkit import CAPTURED_JSON, SHARD, record

MODEL = "models/tiny.gguf"
HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


def generated(cases: int) -> settings:
    """Each example gets its own results folder, so the function-scoped fixtures are shared
    safely."""
    return settings(max_examples=cases, deadline=None, database=None, suppress_health_check=HEALTH)


def assert_clean(result, code: int) -> None:
    assert result.code == code, (
        f"exit {result.code}, expected {code}\nout: {result.out}\nerr: {result.err}"
    )
    for text in (result.out, result.err):
        assert "Traceback" not in text and "internal error" not in text


def mentions(output: str, fragment: str) -> bool:
    """``fragment`` is in the output, however rich wrapped it (even inside a long path)."""
    return "".join(fragment.split()) in "".join(output.split())


def fresh_results(tmp_path: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=tmp_path, prefix="results-"))


def stored_records(kz, folder: Path) -> list[dict[str, object]]:
    """What results list and show report for a results folder; both must answer."""
    listed = kz("--results-dir", str(folder), "results", "list", "--json")
    assert_clean(listed, 0)
    runs = json.loads(listed.out)
    shown: list[dict[str, object]] = []
    for run in runs:
        show = kz("--results-dir", str(folder), "results", "show", run["run_id"], "--json")
        assert_clean(show, 0)
        shown += json.loads(show.out)
    assert sum(run["records"] for run in runs) == len(shown)
    return shown


# --- llama-bench output ---
def json_bytes(tests: object) -> bytes:
    """As llama-bench prints it; NaN and Infinity come out as the literals a buggy printer would
    write."""
    return json.dumps(tests, indent=2, allow_nan=True).encode()


WRONG_TYPES = st.one_of(
    st.text(max_size=8),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
# key -> values that must be refused there (see parse_llama_bench_test)
BAD_VALUES = {
    "n_prompt": st.one_of(
        WRONG_TYPES,
        st.integers(max_value=-1),
        st.integers(min_value=2**31),
        st.floats(allow_nan=False),
    ),
    "n_gen": st.one_of(
        WRONG_TYPES,
        st.integers(max_value=-1),
        st.integers(min_value=2**31),
        st.floats(allow_nan=False),
    ),
    "n_depth": st.one_of(WRONG_TYPES, st.integers(max_value=-1), st.floats(allow_nan=False)),
    "model_size": st.one_of(
        WRONG_TYPES,
        st.integers(max_value=0),
        st.integers(min_value=2**63),
        st.floats(allow_nan=False),
    ),
    "avg_ts": st.one_of(WRONG_TYPES, st.floats(max_value=0), NON_FINITE, st.integers(max_value=0)),
    "stddev_ts": st.one_of(WRONG_TYPES, st.floats(max_value=-1e-9), NON_FINITE),
    "samples_ts": st.one_of(
        st.just([]),
        st.text(max_size=5),
        st.none(),
        st.lists(
            st.one_of(
                st.floats(max_value=0),
                NON_FINITE,
                st.text(max_size=3),
                st.none(),
                st.lists(st.integers(), max_size=1),
            ),
            min_size=1,
            max_size=3,
        ),
    ),
    "samples_ns": st.one_of(
        st.just([1]),
        st.just([1, 2, 3, 4]),
        st.lists(st.integers(max_value=0), min_size=3, max_size=3),
        st.text(max_size=3),
    ),
    "avg_ns": st.one_of(st.just(0), st.integers(max_value=-1), st.text(max_size=3), st.floats()),
    "build_commit": st.one_of(
        st.integers(), st.none(), st.lists(st.text(max_size=2), max_size=2), st.booleans()
    ),
    "model_type": st.one_of(
        st.integers(),
        st.none(),
        st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2),
    ),
    "test_time": st.one_of(st.integers(), st.lists(st.integers(), max_size=2)),
    # configuration fields: any JSON scalar is fine, nested values and non-finite numbers are not;
    # llama-bench's counts are C ints (n_threads: true would be stored as t=True)
    "n_threads": st.one_of(
        st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
        NON_FINITE,
        st.booleans(),
        st.text(max_size=3),
        st.integers(max_value=-1),
        st.integers(min_value=2**31),
    ),
    "n_ubatch": st.one_of(st.booleans(), st.floats(allow_nan=False), st.none()),
    # megabytes in a text field
    "cpu_info": st.integers(4097, 3 << 20).map(lambda n: "x" * n),
    "poll": st.integers(4097, 3 << 20).map(lambda n: "y" * n),
    "devices": st.one_of(st.lists(st.text(max_size=2), max_size=2), NON_FINITE),
    "made_up_config": st.one_of(
        st.lists(st.none(), max_size=2), st.dictionaries(st.text(max_size=2), st.none(), max_size=1)
    ),
}
REQUIRED = (
    "n_prompt",
    "n_gen",
    "avg_ts",
    "stddev_ts",
    "samples_ts",
    "build_commit",
    "model_type",
    "model_size",
)
VALID_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def bad_llama_bench_output(draw) -> tuple[bytes, str]:
    """(stdout, a fragment the error must contain)."""
    tests = json.loads(CAPTURED_JSON.read_text())
    kind = draw(
        st.sampled_from(["value", "value", "value", "missing", "both-zero", "structure", "bytes"])
    )
    if kind == "value":
        index = draw(st.integers(0, len(tests) - 1))
        key = draw(st.sampled_from(sorted(BAD_VALUES)))
        value = draw(BAD_VALUES[key])
        tests[index][key] = value
        return json_bytes(tests), f"test {index}: {key}"
    if kind == "missing":
        index = draw(st.integers(0, len(tests) - 1))
        key = draw(st.sampled_from(REQUIRED))
        del tests[index][key]
        return json_bytes(tests), f"test {index}: missing key '{key}'"
    if kind == "both-zero":
        tests[0].update(n_prompt=0, n_gen=0)
        return json_bytes(tests), "test 0: n_prompt and n_gen are both 0"
    if kind == "structure":
        junk = draw(
            st.sampled_from(
                [
                    ([], "non-empty JSON list"),
                    ({}, "JSON list"),
                    ("pp512", "JSON list"),
                    (None, "JSON list"),
                    (7, "JSON list"),
                    ([1, 2], "test 0: expected a JSON object"),
                    ([tests[0], [tests[1]]], "test 1: expected a JSON object"),
                    ({"tests": tests}, "JSON list"),
                ]
            )
        )
        return json_bytes(junk[0]), junk[1]
    valid = json_bytes(tests)
    how = draw(st.sampled_from(["truncated", "not-utf8", "empty", "text", "deep"]))
    if how == "truncated":  # a killed llama-bench: any cut before the closing bracket
        return valid[: draw(st.integers(1, valid.rindex(b"]") - 1))], "JSON"
    if how == "not-utf8":
        at = draw(st.integers(0, len(valid) - 1))
        return valid[:at] + draw(
            st.sampled_from([b"\xff", b"\xc3", b"\x80\x80", b"\xed\xa0\x80"])
        ) + valid[at:], "not UTF-8"
    if how == "empty":
        return draw(st.sampled_from([b"", b"\n", b"  \n\t"])), "printed nothing"
    if how == "deep":
        return b"[" * draw(st.integers(1000, 200_000)), "JSON"
    text = draw(
        st.text(min_size=1, max_size=40).filter(
            lambda t: t.strip() and t.strip()[0] not in '[{"-0123456789tfn'
        )
    )
    return text.encode(), "not valid JSON"


@st.composite
def valid_llama_bench_output(draw) -> list[dict[str, object]]:
    """Variations llama-bench could print: other numbers, strings and optional keys left out."""
    tests = json.loads(CAPTURED_JSON.read_text())
    for test in tests:
        samples = draw(st.lists(st.floats(min_value=1e-3, max_value=1e9), min_size=1, max_size=6))
        test.update(
            samples_ts=samples,
            avg_ts=draw(st.floats(min_value=1e-3, max_value=1e9)),
            stddev_ts=draw(st.floats(min_value=0, max_value=1e6)),
        )
        test["samples_ns"] = [draw(st.integers(1, 10**12)) for _ in samples]
        test["devices"] = draw(VALID_TEXT)
        test["build_commit"] = draw(VALID_TEXT)
        any_scalar = st.one_of(st.integers(-(2**40), 2**40), st.booleans(), st.none(), VALID_TEXT)
        test[draw(st.sampled_from(["poll", "made_up_config"]))] = draw(any_scalar)
        test["n_threads"] = draw(st.integers(0, 2**31 - 1))
        for optional in draw(
            st.lists(
                st.sampled_from(
                    [
                        "n_depth",
                        "cpu_info",
                        "gpu_info",
                        "avg_ns",
                        "stddev_ns",
                        "samples_ns",
                        "test_time",
                    ]
                ),
                unique=True,
            )
        ):
            test.pop(optional, None)
    return tests


@pytest.fixture
def payload_bench(device_root, tmp_path):
    """A device whose llama-bench prints the bytes of payload.bin, whatever they are."""
    payload = tmp_path / "payload.bin"
    device_root.add_tool("llama-bench", f"#!/bin/sh\nexec cat '{payload}'\n")
    device_root.add_file(MODEL, b"GGUF stand-in")
    return device_root, payload


def run_bench(kz, device_root, folder: Path):
    return kz(
        "--results-dir", str(folder), "bench", "--device", device_root.spec, "-m", MODEL, "--json"
    )


@generated(40)
@given(case=bad_llama_bench_output())
def test_bad_llama_bench_output_is_refused_before_anything_is_stored(
    kz, tmp_path, payload_bench, case
):
    device_root, payload = payload_bench
    stdout, fragment = case
    payload.write_bytes(stdout)
    folder = fresh_results(tmp_path)
    result = run_bench(kz, device_root, folder)
    assert_clean(result, 13)
    assert mentions(result.err, fragment)
    assert mentions(result.err, "000.json")  # names the saved output
    assert stored_records(kz, folder) == []
    assert not (folder / SHARD).exists()


@generated(20)
@given(tests=valid_llama_bench_output())
def test_valid_llama_bench_output_is_stored_exactly(kz, tmp_path, payload_bench, tests):
    device_root, payload = payload_bench
    payload.write_bytes(json_bytes(tests))
    folder = fresh_results(tmp_path)
    assert_clean(run_bench(kz, device_root, folder), 0)
    shown = stored_records(kz, folder)
    assert [r["raw"] for r in shown] == tests
    assert [(r["avg_ts"], r["samples_ts"], r["stddev_ts"]) for r in shown] == [
        (t["avg_ts"], t["samples_ts"], t["stddev_ts"]) for t in tests
    ]


# --- results.jsonl lines ---
def record_lines(count: int) -> list[str]:
    return [
        canonical_json(
            record(run_id=f"r{n}", host_time=f"2026-10-{n + 1:02d}T00:00:00+00:00").to_dict()
        )
        for n in range(count)
    ]


def standard_json(text: str) -> bool:
    """Whether a strict standard JSON parser reads it (the test's own oracle, not kzbuild's)."""

    def refuse(name: str) -> object:
        raise ValueError(name)

    try:
        json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError):
        return False
    return True


RECORD_FIELD_DAMAGE = [
    ("run_id", 5),
    ("kind", "other"),
    ("host_time", None),
    ("seq", -1),
    ("seq", 1.5),
    ("seq", True),
    ("test", ["pp"]),
    ("avg_ts", "fast"),
    ("avg_ts", -1.0),
    ("avg_ts", 0),
    ("samples_ts", ["1"]),
    ("samples_ts", [0.0]),
    ("samples_ts", "1,2"),
    ("samples_ts", [[1.0]]),
    ("device", "pad3"),
    ("device", {"address": ""}),
    ("build", None),
    ("model", []),
    ("env", {"A": 1}),
    ("env", ["A=1"]),
    ("config", {"n_threads": [8]}),
    ("config", {"n": {"x": 1}}),
    ("argv", "llama-bench -t 8"),
    ("argv", [1]),
    ("range_ts", [58.0, 44.0]),
    ("range_ts", [1.0]),
    ("sweep", {"total": 0}),
    ("sweep", {"point": {"t": 1}}),
    ("unit", None),
    ("conditions", []),
    ("raw", "x"),
    ("stddev_ts", -0.5),
    ("made_up", 1),
]


@st.composite
def bad_jsonl_line(draw) -> tuple[bytes, str]:
    """(a line without its newline, its class): 'not-json' lines are skipped when last and
    unterminated, 'shape' lines never."""
    line = record_lines(1)[0].replace('"r0"', '"bad"')
    kind = draw(
        st.sampled_from(["truncated", "not-utf8", "shape", "field", "field", "text", "non-finite"])
    )
    if kind == "truncated":
        return line[: draw(st.integers(1, len(line) - 1))].encode(), "not-json"
    if kind == "not-utf8":
        at = draw(st.integers(0, len(line) - 1))
        return line[:at].encode() + draw(
            st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80"])
        ) + line[at:].encode(), "not-json"
    if kind == "shape":
        return json.dumps(
            draw(
                st.one_of(
                    st.lists(st.integers(), max_size=3),
                    st.integers(),
                    st.text(max_size=5),
                    st.none(),
                    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
                )
            )
        ).encode(), "shape"
    if kind == "field":
        data = json.loads(line)
        key, value = draw(st.sampled_from(RECORD_FIELD_DAMAGE))
        data[key] = value
        return json.dumps(data).encode(), "shape"
    if kind == "non-finite":
        data = json.loads(line)
        data[draw(st.sampled_from(["avg_ts", "stddev_ts"]))] = draw(NON_FINITE)
        return json.dumps(data).encode(), "not-json"
    text = draw(
        st.text(
            st.characters(
                blacklist_categories=("Cs",),
                blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
            ),
            min_size=1,
            max_size=30,
        ).filter(str.strip)
    )
    return text.encode(), "not-json" if not standard_json(text) else "shape"


@generated(40)
@given(
    bad=bad_jsonl_line(),
    good=st.integers(0, 4),
    position=st.integers(0, 4),
    terminated=st.booleans(),
)
def test_bad_results_jsonl_lines_are_refused_or_a_truncated_tail_skipped(
    kz, tmp_path, bad, good, position, terminated
):
    line, kind = bad
    lines = record_lines(good)
    position = min(position, good)
    last = position == good
    folder = fresh_results(tmp_path)
    export = folder / SHARD
    export.write_bytes(
        b"".join(text.encode() + b"\n" for text in lines[:position])
        + line
        + (b"\n" if terminated or not last else b"")
        + b"".join(text.encode() + b"\n" for text in lines[position:])
    )
    listed = kz("--results-dir", str(folder), "results", "list", "--json")
    where = f"{export}:{position + 1}"
    if kind == "not-json" and last and not terminated:  # a writer killed mid-line
        assert_clean(listed, 0)
        assert mentions(listed.err, where) and "skipped" in listed.err
        assert len(stored_records(kz, folder)) == good
        with ResultsStore(folder) as store:  # the next record starts on a line of its own
            store.add(
                [record(run_id="next", host_time="2026-10-28T00:00:00+00:00")]
            )  # the same shard
        assert [json.loads(text)["run_id"] for text in export.read_text().splitlines()] == [
            *(f"r{n}" for n in range(good)),
            "next",
        ]
        return
    assert_clean(listed, 13)
    assert mentions(listed.err, where)
    assert_clean(kz("--results-dir", str(folder), "results", "show", "latest"), 13)
    export.write_text(
        "".join(text + "\n" for text in lines)
    )  # fixed by hand: everything answers again, nothing of the bad line stayed
    assert [r["run_id"] for r in stored_records(kz, folder)] == [f"r{n}" for n in range(good)]


# --- database bytes ---
@st.composite
def damaged_database(draw, original: bytes) -> bytes:
    how = draw(
        st.sampled_from(
            ["random", "truncated", "overwritten", "zeroed", "empty", "appended", "flipped"]
        )
    )
    if how == "random":
        return draw(st.binary(min_size=1, max_size=4096))
    if how == "truncated":
        return original[: draw(st.integers(0, len(original) - 1))]
    if how == "empty":
        return b""
    if how == "appended":
        return original + draw(st.binary(min_size=1, max_size=512))
    start = draw(st.integers(0, len(original) - 1))
    if how == "flipped":
        data = bytearray(original)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    length = draw(st.integers(1, 1024))
    filler = bytes(length) if how == "zeroed" else draw(st.binary(min_size=length, max_size=length))
    return original[:start] + filler[: len(original) - start] + original[start + length :]


@pytest.fixture
def healthy_store(tmp_path) -> tuple[Path, bytes, list[BenchRecord]]:
    folder = tmp_path / "healthy"
    stored = [
        record(
            run_id=f"r{n}",
            host_time=f"2026-10-{n + 1:02d}T00:00:00+00:00",
            samples=(100.0 + n, 99.0, 101.0),
        )
        for n in range(6)
    ]
    with ResultsStore(folder) as store:
        store.add(stored)
    return folder, (folder / resultsdb.DB_FILE).read_bytes(), stored


@generated(30)
@given(data=st.data())
def test_a_damaged_database_is_rebuilt_and_never_shows_wrong_numbers(
    kz, tmp_path, healthy_store, data
):
    source, original, stored = healthy_store
    folder = fresh_results(tmp_path)
    (folder / SHARD).write_bytes((source / SHARD).read_bytes())
    (folder / resultsdb.DB_FILE).write_bytes(data.draw(damaged_database(original)))
    shown = stored_records(kz, folder)
    assert [(r["run_id"], r["samples_ts"], r["record_id"]) for r in shown] == [
        (r.run_id, list(r.samples_ts), r.record_id) for r in stored
    ]
    compared = kz("--results-dir", str(folder), "results", "compare", "r0", "r5", "--json")
    assert_clean(compared, 0)
    assert json.loads(compared.out)["rows"][0]["b"]["median"] == 101.0


def test_odd_but_valid_records_show_compare_and_plot(kz, project):
    """Extreme numbers, markup-like and unicode text, null and huge config values are valid: every
    view answers."""
    odd = {
        "config": {
            "n_threads": 8,
            "devices": "[red]HTP0[/red]",
            "huge": 10**30,
            "none": None,
            "flag": True,
            "text": "🚀\x00|",
        },
        "env": {"GGML_X": "a|b [bold]"},
    }
    with ResultsStore(project.root / "results") as store:
        store.add(
            [
                record(run_id="[r1]", build_id="b|1", samples=(1e-3,), **odd),
                record(
                    run_id="r2",
                    build_id="b2",
                    samples=(1e9, 1e9),
                    host_time="2026-10-02T00:00:00+00:00",
                    **odd,
                ),
            ]
        )
    for args in (
        ("results", "list"),
        ("results", "show", "[r1]", "--markdown"),
        ("results", "show", "latest"),
    ):
        assert_clean(kz(*args), 0)
    compared = kz("results", "compare", "[r1]", "r2", "--json")
    assert_clean(compared, 0)
    assert json.loads(compared.out)["rows"][0]["verdict"] == "improvement"
    assert_clean(kz("results", "plot", "--out", str(project.root / "odd.png")), 0)
    assert (project.root / "odd.png").stat().st_size > 1000


@pytest.mark.parametrize("axis", ["t", "env:GGML_X"])
def test_a_plot_along_an_axis_of_numbers_and_words_draws_them_all_as_words(kz, project, axis):
    """matplotlib puts numbers or text on one axis, never both: a sweep of 1,2,auto or a config
    value of null."""
    values = ["1", "2", "auto", "nan", "1e400", None]
    with ResultsStore(project.root / "results") as store:
        store.add(
            [
                record(
                    run_id="r1",
                    seq=n,
                    **(
                        {"config": {"n_threads": value}}
                        if axis == "t"
                        else {"env": {"GGML_X": str(value)}}
                    ),
                )
                for n, value in enumerate(values)
            ]
        )
    assert_clean(kz("results", "plot", "--axis", axis, "--out", str(project.root / "axis.png")), 0)


@pytest.mark.parametrize("count", [1, 3])
def test_a_results_jsonl_starting_with_a_utf8_bom_is_read(kz, tmp_path, count):
    folder = fresh_results(tmp_path)
    lines = record_lines(count)
    text = "".join(f"{line}\n" for line in lines)
    (folder / resultfiles.LEGACY_FILE).write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert len(stored_records(kz, folder)) == count
